"""The application: the training loop, resume, evaluation of a checkpoint, the command-line glue and the Python
functions ``nvil.train`` / ``nvil.evaluate`` that do what ``train.py`` and ``evaluate.py`` do."""
