"""What gradient learners of directed models share: one update from a surrogate loss, and the optimiser
and generator state a resumed run needs."""

from __future__ import annotations

import torch
from torch import nn


def grad_norms(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """``grad_norm/<group>``: the global gradient norm of each named parameter group."""
    out = {}
    for group in optimizer.param_groups:
        grads = [p.grad for p in group["params"] if p.grad is not None]
        if grads:
            out[f"grad_norm/{group['name']}"] = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    return out


class SurrogateLearner(nn.Module):
    """Subclasses set ``optimizer`` and ``generator`` and define ``surrogate(x) -> (loss, metrics)``,
    whose gradient is minus the update direction; extra resumable state goes in ``extra_state``."""

    optimizer: torch.optim.Optimizer
    generator: torch.Generator

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
        """One update on the minibatch ``x``; metrics stay on the device (no host sync)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss, metrics = self.surrogate(x)
        loss.backward()
        if diagnostics:
            metrics.update(grad_norms(self.optimizer))
        self.optimizer.step()
        return metrics

    def extra_state(self) -> dict[str, nn.Module]:
        return {}

    def learner_state(self) -> dict:
        """Everything a resumed run needs beyond the model: optimiser, RNG, and ``extra_state``."""
        state = {"optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state()}
        state.update({name: module.state_dict() for name, module in self.extra_state().items()})
        return state

    def load_learner_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"].cpu())
        for name, module in self.extra_state().items():
            module.load_state_dict(state[name])
