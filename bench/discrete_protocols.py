"""The published protocols that ``bench/discrete_estimators.py --protocol NAME`` sets up, and the anchors (published
figures) it prints beside its own, each with its protocol. Data, not a script."""

# --protocol: the published protocols of the anchors below (defaults, per-estimator overrides; the command line wins)
# RELAX's protocol: REBAR and RELAX as the authors' code (duvenaud/relax) trains them: one Adam (beta2 0.99999) at one
# rate for the model and q, the control variate at 10x that rate on the logit-space variance; RELAX's r_rho one
# net per layer on (x - mean, z, 2 b_below - 1), two ReLU layers of 200, weight decay 1e-4. (The authors' learning
# rate was tuned per model and is not published in PAPERS.md; ours is the learner's 1e-3.)
AUTHORS_REBAR = ["learner.inference_lr_scale=1", "learner.beta2=0.99999", "learner.cv_lr_scale=10",
                 "learner.cv_objective=logits", "learner.cv_noise=common"]
# NVIL as the REBAR authors' code (tensorflow/models research/rebar, ``get_nvil_gradient``) trains the anchor's NVIL:
# the same Adam for model and q, the input-dependent baseline (100 tanh units on x - mean) alone, trained at 10x
# the rate on the squared signal, no running mean and no variance normalisation.
AUTHORS_NVIL = ["learner.inference_lr_scale=1", "learner.beta2=0.99999", "learner.baseline_lr_scale=10",
                "learner.constant_baseline=false", "learner.variance_normalisation=false"]
# DisARM's protocol as its authors' code trains it (google-research disarm/binary/experiment_launcher_singlelayer.py):
# dynamic binarisation, one Adam per network at 1e-4 (model and q alike), batch 50, 1M steps; REINFORCE LOO with two
# samples (one pair). There the prior's logits have an SGD optimiser of their own at 1e-2; here, the model's Adam.
AUTHORS_DISARM = ["data.binarize=dynamic", "learner.lr=1e-4", "learner.inference_lr_scale=1"]
PROTOCOLS = {
    "relax": {"defaults": {"estimators": "nvil,rebar,relax", "models": "sbn200", "steps": 2_000_000, "batch_size": 24},
              "overrides": {"nvil": AUTHORS_NVIL, "rebar": AUTHORS_REBAR,
                            "relax": AUTHORS_REBAR + ["learner.cv_inputs=x_z", "learner.cv_depth=2",
                                                      "learner.cv_activation=relu", "learner.cv_weight_decay=1e-4"]}},
    "disarm": {"defaults": {"estimators": "rloo,arm,disarm", "models": "sbn200", "steps": 1_000_000, "batch_size": 50},
               "overrides": {"*": AUTHORS_DISARM + ["trainer.accel=compile"],  # all three on the hand-derived path
                             "rloo": ["learner.num_samples=2"]}},
    "vimco": {"defaults": {"estimators": "vimco", "models": "sbn200x3"},  # compiled: its hand-derived step
              "overrides": {"vimco": ["learner.num_samples=5", "trainer.accel=compile"]}},
}
# (estimator, model, figure in nats (positive: a negated bound or NLL), measure, protocol)
ANCHORS = [
    ("nvil", "sbn200", 112.5, "-training ELBO",
     "RELAX Table 1: linear SBN-200, fixed binarisation, 2M updates, batch 24"),
    ("rebar", "sbn200", 111.6, "-training ELBO", "RELAX Table 1 (same protocol)"),
    ("relax", "sbn200", 111.2, "-training ELBO", "RELAX Table 1 (same protocol)"),
    ("vimco", "sbn200x3", 93.6, "test NLL", "VIMCO (Mnih & Rezende 2016): SBN-200-200-200, K = 5"),
    ("disarm", "sbn200", None, "-training ELBO",
     "DisARM Table 1: dynamic binarisation, 1M updates at batch 50 (its figures are not copied into PAPERS.md)"),
]
