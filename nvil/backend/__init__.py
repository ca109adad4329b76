"""How the hot loops run: ``torch.compile`` (``accel``), the native kernels that pay for themselves, denormal
flushing and the choice of torch's CPU kernel set. Nothing here runs on import; the entry points opt in."""
