"""The package's version: the server's (CMake project version), kept by update_stubs.sh."""
__version__ = "0.1.0"
