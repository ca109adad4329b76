"""Every hand-written fast path the project keeps, in one place: what it speeds up, the general path (plain torch,
autograd or ``torch.compile``) that defines it, the gain measured on a workload users run, and the test that checks
it against the definition.

The rule: the general path is the definition; a fast path stays only where it buys at least 1.5x on a workload users
run (the README's default job, or a reproduction's), is chosen where its entry says, and is tested against the
definition. ``tests/test_fast_paths.py`` checks that each entry names an existing function and test file and that
every module of ``nvil/backend/native`` is here. Paths measured under 1.5x are not kept (docs/benchmarks.md, "Fast
paths kept and removed": the small-batch product kernel, the centred sparse inputs, Adam in C, AIS's weight increment
in C, the C draws of AIS, block Gibbs and the K-sample bounds); the oneDNN routing of ``nvil.backend.gemm`` measured
>= 1.5x and is kept. Denormal flushing (``nvil.backend.denormals``) is a floating-point
mode, not another implementation of an algorithm, and is not listed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FastPath:
    """One fast path: ``function`` (dotted name) replaces ``definition`` (dotted name) where ``chosen`` says, for
    ``speeds_up``; ``gain`` measured on ``workload``; ``test`` (a path from the repository root) checks the two
    agree."""

    speeds_up: str
    function: str
    definition: str
    chosen: str
    gain: str
    workload: str
    test: str


FAST_PATHS: dict[str, FastPath] = {
    "sequential_sweep": FastPath(
        speeds_up="a single-site Gibbs sweep over a binary density's latent units (Chib, harmonic mean, "
                  "per-example AIS over h)",
        function="nvil.backend.native.sequential_sweep",
        definition="nvil.mcmc.sequential_gibbs.unit_update",
        chosen="SequentialGibbs.sweep: accel=auto / native on a CPU where the C kernels build",
        gain="20-28x", workload="SequentialGibbs sweeps, SBN-200 and DBN 784-500-2000 h1, 50-500 chains, one thread "
                                "(bench/sequential_sweeps.py)",
        test="tests/test_sequential_fast.py"),
    "structured_sequential_gibbs": FastPath(
        speeds_up="a single-site Gibbs sweep over binary latents from the density's structure (pairwise and "
                  "softplus terms, ``BinaryDensity``) instead of two values of log f per unit (Chib, harmonic mean, "
                  "AIS from Q on the built-in families)",
        function="nvil.mcmc.sequential_gibbs.SequentialGibbs",
        definition="nvil.mcmc.flip_gibbs.FlipGibbs",
        chosen="nvil.mcmc.flip_gibbs.site_gibbs: every term of the target a BinaryDensity",
        gain="1.42x eager, 40x with the C sweep it enables (sequential_sweep)",
        workload="one sweep over an SBN-200's latents given 784 pixels, 50 chains, one thread "
                 "(bench/structured_gibbs.py)",
        test="tests/test_flip_gibbs.py"),
    "lateral_sweep": FastPath(
        speeds_up="the semi-RBM's sequential sweep over laterally coupled pixels (SAP / Trans-SAP on sap_srbm500)",
        function="nvil.backend.native.lateral_sweep",
        definition="nvil.models.visible.blocked_sweep",
        chosen="LateralBernoulli.sample_field: accel=auto / native on a CPU",
        gain="6.8x the sweep on the eager sweep's uniforms", workload="semi-RBM pixel sweep, 784 pixels, 100 "
                                                                      "chains, one thread (bench/sequential_sweeps.py)",
        test="tests/test_sequential_fast.py"),
    "triton_sweep": FastPath(
        speeds_up="the same sequential sweeps (over h, and over the pixels) on CUDA, one Triton kernel per sweep",
        function="nvil.backend.native.triton_sweep.sequential_sweep",
        definition="nvil.mcmc.sequential_gibbs.unit_update",
        chosen="SequentialGibbs.sweep / LateralBernoulli.sample_field: accel=auto on CUDA with Triton",
        gain="60-117x", workload="sweeps over h (SBN-200, DBN h1, 500 chains) and a sap_srbm500 update on a GPU "
                                 "(bench/sequential_sweeps.py)",
        test="tests/test_triton_sweep.py"),
    "autoregressive_draw": FastPath(
        speeds_up="drawing an autoregressive layer's units in index order (an autoregressive q, fDARN's prior)",
        function="nvil.backend.native.autoregressive",
        definition="nvil.models.autoregressive.AutoregressiveLinear.sample",
        chosen="AutoregressiveLinear.sample: accel=auto / native on a CPU",
        gain="1.52x the NVIL step", workload="NVIL (Adam) on an SBN-200 with an autoregressive q, batch 20, one "
                                             "thread (bench/before_after.py --groups autoregressive)",
        test="tests/test_autoregressive.py"),
    "bernoulli_log_prob": FastPath(
        speeds_up="a Bernoulli layer's log-probability per row, the K-sample bounds' largest elementwise pass",
        function="nvil.backend.native.bernoulli_log_prob.bernoulli_log_prob",
        definition="nvil.core.ops.bernoulli_log_prob",
        chosen="in_c: float32 CPU operands of at least 4,096 terms, outside autograd and compilation",
        gain="1.5x", workload="IWAE evaluation of an SBN-200, 100 images x 341 samples per chunk, one thread",
        test="tests/test_bernoulli_log_prob.py"),
    "onednn_products": FastPath(
        speeds_up="float32 CPU products of at least 4 M multiply-adds outside autograd, on a CPU with AVX-512 whose "
                  "MKL runs AVX2 (AMD's): RBM Gibbs / AIS / SAP products, the K-sample bounds' decoders",
        function="nvil.backend.gemm.onednn_linear",
        definition="torch.nn.functional.linear",
        chosen="nvil.backend.gemm.backend(): NVIL_GEMM, else oneDNN on an AMD CPU with AVX-512",
        gain="1.6-1.9x block Gibbs at 1,000 chains; 1.6-1.7x tempered transitions; 1.9x the SAP gradient; "
             "1.4-1.5x IWAE and AIS at 1,000 chains; 1.0x MCEM-HMC and NVIL at batch 20",
        workload="RBM 784-500 (Trans-SAP, SAP, AIS), IWAE of an SBN-200, one thread, NVIL_GEMM=aten against auto in "
                 "alternating processes",
        test="tests/test_gemm.py"),
    "rbm_sufficient_statistics": FastPath(
        speeds_up="the gradient of a Boltzmann machine's free energy (SAP / PCD / CD on RBMs and semi-RBMs)",
        function="nvil.models.rbm_grad.free_energy_grad",
        definition="nvil.models.rbm.BoltzmannMachine.free_energy",
        chosen="the SAP-family learners where the visible layer is in rbm_grad.BIAS_GRAD, else autograd",
        gain="1.45x with torch's products, 2.8x with the oneDNN routing (autograd's products stay torch's)",
        workload="the gradient of an RBM 784-500 from 100 data and 100 particle rows, one thread",
        test="tests/test_sap_fast.py"),
    "nvil_hand_derived": FastPath(
        speeds_up="NVIL's gradients for layered Bernoulli models without an autograd graph (the default job)",
        function="nvil.learners.fused.LayeredBernoulliGradients.output_grads",
        definition="nvil.learners.nvil.NVIL.surrogate",
        chosen="fused.covers(model, inference): an SBN / fDARN with a Bernoulli inference network",
        gain="1.6x with Adam, 2.0x with SGD", workload="the default job's NVIL step, SBN-200, batch 20, one thread, "
                                                     "trainer.accel=auto in a 50,000-update run (bench/nvil_step_paths.py)",
        test="tests/test_nvil_fused.py"),
    "gaussian_closed_form_gradient": FastPath(
        speeds_up="HMC's gradient on a Gaussian net's tempered posterior (AIS-HMC, BDMC, Chib-MH, MCEM-HMC) without "
                  "an autograd graph",
        function="nvil.models.gaussian_grad.LogJoint.value_and_grad",
        definition="nvil.core.ops.value_and_grad",
        chosen="ModelPath (nvil.estimators.model_paths): HMC from the prior on a model that declares "
               "closed_form_gradient (the Gaussian nets: ais_hmc, bdmc, ais), and learner=mcem_hmc, at accel=none; "
               "accel=compile differentiates the compiled density by autograd instead",
        gain="2.3-2.5x", workload="an AIS-HMC run, GBN 784-64-64 in auxiliary form, 100-1,600 chains, 10 leapfrog "
                                  "steps, one thread (bench/gaussian_grad.py)",
        test="tests/test_hmc_fast.py"),
}
