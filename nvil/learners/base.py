"""What gradient learners of directed models share: one update from a surrogate loss, and the optimiser
and generator state a resumed run needs."""

from __future__ import annotations

import torch
from torch import nn

from nvil import distributed


def grad_norms(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """``grad_norm/<group>``: the global gradient norm of each named parameter group."""
    out = {}
    for group in optimizer.param_groups:
        grads = [p.grad for p in group["params"] if p.grad is not None]
        if grads:
            out[f"grad_norm/{group['name']}"] = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    return out


class DataParallel:
    """What a learner does to run as one rank of several (``nvil.distributed``): its ``forward`` computes the
    loss through ``DistributedDataParallel``, which averages the gradients over ranks; ``rank_state`` is what
    differs between ranks and travels in the checkpoint once per rank."""

    generator: torch.Generator

    def distribute(self, d: distributed.Dist, device: torch.device) -> None:
        # Kept out of nn.Module's registry: the wrapper must not appear in state_dict or parameters().
        self.__dict__["_ddp"] = distributed.wrap(self, device)

    @property
    def data_parallel(self) -> bool:
        return "_ddp" in self.__dict__

    def loss_module(self) -> nn.Module:
        """The module whose call computes the loss: the DDP wrapper under torchrun, else the learner itself."""
        return self.__dict__.get("_ddp", self)

    def rank_state(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_rank_state(self, state: dict) -> None:
        self.generator.set_state(state["generator"].cpu())


class SurrogateLearner(DataParallel, nn.Module):
    """Subclasses set ``optimizer`` and ``generator`` and define ``surrogate(x) -> (loss, metrics)``,
    whose gradient is minus the update direction; extra resumable state goes in ``extra_state``.
    ``surrogate(x, diagnostics=False)`` may leave out the metrics only a logging step reads."""

    optimizer: torch.optim.Optimizer
    generator: torch.Generator

    def forward(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        return self.surrogate(x, diagnostics=diagnostics)

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
        """One update on the minibatch ``x``; metrics stay on the device (no host sync)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss, metrics = self.loss_module()(x, diagnostics)
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
