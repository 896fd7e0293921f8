"""Backend test suites that run twice: on the GPU against the real kernels (tests/gpu) and on the CPU
against the stand-ins (tests/backends). The importing module provides the ``env`` fixture
(backend_cases.GPU or backend_cases.CPU) and, on the CPU, installs the stand-ins."""
