"""Wake-sleep (Hinton et al. 1995), the comparison in Mnih & Gregor 2014 (Sec. 3.2, Table 1).

- wake: h ~ q(h | x) on the data and the same model update as NVIL, grad_theta log p(x, h);
- sleep: (x, h) ~ p(x, h) from the model and the recognition update grad_phi log q(h | x).

The sleep phase does not follow the gradient of any bound, so ``train/elbo`` (reported from the wake
samples, like NVIL's) is a diagnostic, not the quantity being ascended.
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.learners.base import SurrogateLearner, build_optimizer, directed_groups


class WakeSleep(SurrogateLearner):
    def __init__(self, model: nn.Module, inference: nn.Module, cfg, device: torch.device, seed: int) -> None:
        super().__init__()
        self.model, self.inference, self.cfg = model, inference, cfg
        self.to(device)
        self.optimizer = build_optimizer(directed_groups(model, inference, cfg)[1], cfg)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.sleep_batch = cfg.get("sleep_batch_size")

    def surrogate(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        # Wake phase: recognise the data, fit the model to (x, h).
        with torch.no_grad():
            hs, log_q = self.inference.sample(x, generator=self.generator)
        log_p = self.model.log_joint(x, hs)
        wake_loss = -log_p.mean()
        # Sleep phase: dream (x, h) from the model, fit the recognition network to it.
        n = int(self.sleep_batch or x.shape[0])
        x_dream, h_dream = self.model.sample(n, generator=self.generator)
        sleep_log_q = self.inference.log_prob(h_dream, x_dream)
        sleep_loss = -sleep_log_q.mean()
        metrics = {
            "train/elbo": (log_p.detach() - torch.stack(log_q).sum(0)).mean(),
            "train/model_loss": wake_loss.detach(),
            "wake_sleep/sleep_log_q": sleep_log_q.detach().mean(),
        }
        return wake_loss + sleep_loss, metrics
