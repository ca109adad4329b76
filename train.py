"""Train a latent-variable model, then evaluate it with its family's final evaluation (``nvil-train`` installed).

    python train.py                                   # the default job: SBN-200, NVIL, binarised MNIST, then evaluate
    python train.py model=sbn model.layers=[200,200,200] learner=nvil data=mnist trainer.max_steps=100000 seed=1
    python train.py experiment=nvil_sbn200            # the NVIL paper's settings
    python train.py hydra.run.dir=outputs/run1 trainer.resume=true   # continue a run with its own config
    torchrun --nproc_per_node=2 train.py trainer.batch_size=100      # data-parallel: 50 examples per rank
    tensorboard --logdir outputs

The job itself is ``nvil.app.main`` (after ``nvil.app.entry``'s choice of CPU kernels); from Python, ``nvil.train(...)``.
"""

from nvil.app import entry

if __name__ == "__main__":
    entry.train()
