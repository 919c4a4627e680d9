"""Test session settings: one thread per process.

The checks work on tiny tensors, for which torch's thread pool costs more than it saves, especially with
several kernels running at once on a small machine; kernels started by the tests inherit the setting.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # after the environment variable, which torch reads on import

torch.set_num_threads(1)
