"""Messages and stubs generated from proto/attnserve/v1/attention.proto (protoc 3.21 and
grpc_python_plugin, Debian 12). Do not edit: run client/python/update_stubs.sh after changing the
proto; the ctest python_package_sources fails while these differ from a fresh generation.
"""
