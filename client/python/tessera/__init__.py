"""Tessera Python client: tensors as numpy arrays, kernels, jobs and the admin API.

Example::

    import numpy as np
    import tessera

    with tessera.Client() as client:        # $TESSERA_ADDR, $TESSERA_TOKEN
        a = client.put(np.ones((2, 3), np.float32))
        b = client.put(np.ones((3, 2), np.float32))
        print(client.run("matmul", a, b).numpy())
"""
import pkgutil

# The generated stubs (tessera._proto) live in the build tree (build/client/python/gen) or,
# once installed, inside the package; let either `tessera` directory on sys.path serve.
__path__ = pkgutil.extend_path(__path__, __name__)  # noqa: F821

from .errors import (AlreadyExists, Cancelled, DataLoss, DeadlineExceeded,  # noqa: E402
                     FailedPrecondition, Internal, InvalidArgument, JobFailed, NotFound,
                     PermissionDenied, QuotaExceeded, TesseraError, Unauthenticated,
                     Unavailable)
from .client import Admin, Client, Job, Kernel, Program, StepRef, Tensor  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "Admin", "Client", "Job", "Kernel", "Program", "StepRef", "Tensor", "TesseraError",
    "InvalidArgument", "NotFound", "AlreadyExists", "QuotaExceeded", "FailedPrecondition",
    "Unauthenticated", "PermissionDenied", "Unavailable", "DeadlineExceeded", "Cancelled",
    "Internal", "DataLoss", "JobFailed",
]
