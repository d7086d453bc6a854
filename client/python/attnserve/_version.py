"""The server's version (the CMake project version), written by update_stubs.sh."""
__version__ = "0.1.0"
