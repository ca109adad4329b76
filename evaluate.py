"""Evaluate a checkpoint with one estimator; print one JSON line and append it beside the checkpoint
(``nvil-evaluate`` installed).

    python evaluate.py checkpoint=outputs/run1/checkpoints/best.pt estimator=iwae estimator.num_samples=5000
    python evaluate.py checkpoint=PATH estimator=elbo estimator.num_samples=10 data.split=test eval.num_examples=1000
    python evaluate.py checkpoint=PATH estimator=exact        # models with at most 20 latent units
    torchrun --nproc_per_node=4 evaluate.py checkpoint=PATH estimator=ais   # the examples shared by 4 ranks

The job itself is ``nvil.app.main`` (after ``nvil.app.entry``'s choice of CPU kernels); from Python, ``nvil.evaluate(...)``.
"""

from nvil.app import entry

if __name__ == "__main__":
    entry.evaluate()
