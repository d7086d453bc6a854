# The Python package client/python/attnserve against live servers (Debian's python3-grpcio,
# python3-protobuf, python3-numpy; torch parts skip when torch is not importable). Included from
# tests/python/CMakeLists.txt.
foreach(t test_python_client test_python_client_async)
  add_test(NAME python_${t}
    COMMAND /usr/bin/python3 -m unittest -v ${t}
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(python_${t} PROPERTIES
    LABELS "python;client;integration"
    TIMEOUT 300
    ENVIRONMENT "ATTNSERVE_BIN=$<TARGET_FILE:attnserve>;ATTNSERVE_STUBS=${CMAKE_BINARY_DIR}/python/attnserve_pb;ATTNSERVE_SEED_VECTORS_DIR=${ATTNSERVE_SEED_VECTORS_DIR};PYTHONDONTWRITEBYTECODE=1")
endforeach()
