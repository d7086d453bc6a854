# The Python package client/python as a user installs it (Debian's python3-grpcio,
# python3-protobuf, python3-numpy; torch parts skip when torch is not importable). Included from
# tests/python/CMakeLists.txt.
set(PY_PACKAGE_WORK ${CMAKE_CURRENT_BINARY_DIR}/package)
get_target_property(PY_GRPC_PYTHON_PLUGIN gRPC::grpc_python_plugin LOCATION)

# The checked-in stubs and version match the proto and the CMake project version.
add_test(NAME python_package_sources
  COMMAND ${CMAKE_COMMAND} -E env PROTOC=$<TARGET_FILE:protobuf::protoc>
          GRPC_PYTHON_PLUGIN=${PY_GRPC_PYTHON_PLUGIN} ATTNSERVE_VERSION=${PROJECT_VERSION}
          ${ATTNSERVE_ROOT}/client/python/update_stubs.sh --check)
set_tests_properties(python_package_sources PROPERTIES LABELS "python;client;unit" TIMEOUT 60)

# The wheel, built from a copy of client/python and installed into a fresh virtual environment.
add_test(NAME python_package_install
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/package_test.sh install ${PY_PACKAGE_WORK})
set_tests_properties(python_package_install PROPERTIES
  LABELS "python;client;integration" TIMEOUT 300 FIXTURES_SETUP python_package)

# The client tests with that environment's python, from a folder outside the source tree.
foreach(t test_python_client test_python_client_async test_sessions_client)
  add_test(NAME python_${t}
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/package_test.sh run ${PY_PACKAGE_WORK} ${t})
  set_tests_properties(python_${t} PROPERTIES
    LABELS "python;client;integration"
    TIMEOUT 300
    FIXTURES_REQUIRED python_package
    ENVIRONMENT "ATTNSERVE_BIN=$<TARGET_FILE:attnserve>;ATTNSERVE_SEED_VECTORS_DIR=${ATTNSERVE_SEED_VECTORS_DIR};PYTHONDONTWRITEBYTECODE=1")
endforeach()

# Client-side adaptive throttling with a fake clock, fake stubs and an in-process grpc server: no
# attnserve process. tests/testing/throttle_cases.json is shared with the Node.js client's test.
add_test(NAME python_test_throttle
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/package_test.sh run ${PY_PACKAGE_WORK} test_throttle)
set_tests_properties(python_test_throttle PROPERTIES
  LABELS "python;client;unit"
  TIMEOUT 120
  FIXTURES_REQUIRED python_package
  ENVIRONMENT "ATTNSERVE_THROTTLE_CASES=${ATTNSERVE_ROOT}/tests/testing/throttle_cases.json;PYTHONDONTWRITEBYTECODE=1")

# Decode sessions against live servers (two for routing), attnserve-cli session and
# attnserve-bench --rpc=decode included.
add_test(NAME python_test_sessions_live
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/package_test.sh run ${PY_PACKAGE_WORK} test_sessions_live)
set_tests_properties(python_test_sessions_live PROPERTIES
  LABELS "python;client;integration"
  TIMEOUT 600
  FIXTURES_REQUIRED python_package
  ENVIRONMENT "ATTNSERVE_BIN=$<TARGET_FILE:attnserve>;ATTNSERVE_CLI=$<TARGET_FILE:attnserve-cli>;ATTNSERVE_BENCH=$<TARGET_FILE:attnserve-bench>;PYTHONDONTWRITEBYTECODE=1")

# Sessions moved between three live servers (MoveSession, a drain with --session_peers) are
# followed by the client, sync and asyncio.
add_test(NAME python_test_session_moves_live
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/package_test.sh run ${PY_PACKAGE_WORK} test_session_moves_live)
set_tests_properties(python_test_session_moves_live PROPERTIES
  LABELS "python;client;integration"
  TIMEOUT 600
  FIXTURES_REQUIRED python_package
  ENVIRONMENT "ATTNSERVE_BIN=$<TARGET_FILE:attnserve>;PYTHONDONTWRITEBYTECODE=1")

# A rolling restart of three live replicas under a decode load (SIGTERM, drain moves the
# sessions, a new process on the same address): no session lost, every step bit for bit.
add_test(NAME python_test_rolling_restart_live
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/package_test.sh run ${PY_PACKAGE_WORK} test_rolling_restart_live)
set_tests_properties(python_test_rolling_restart_live PROPERTIES
  LABELS "python;client;integration"
  TIMEOUT 600
  FIXTURES_REQUIRED python_package
  ENVIRONMENT "ATTNSERVE_BIN=$<TARGET_FILE:attnserve>;PYTHONDONTWRITEBYTECODE=1")

# A process killed in the middle of a move (SIGKILL of the sender or of the receiver, inside
# the transfer by construction): the session whole on exactly one replica, or lost as
# documented; never two copies.
add_test(NAME python_test_move_kill_live
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/package_test.sh run ${PY_PACKAGE_WORK} test_move_kill_live)
set_tests_properties(python_test_move_kill_live PROPERTIES
  LABELS "python;client;integration"
  TIMEOUT 600
  FIXTURES_REQUIRED python_package
  ENVIRONMENT "ATTNSERVE_BIN=$<TARGET_FILE:attnserve>;PYTHONDONTWRITEBYTECODE=1")

# The examples of client/python/README.md and of README.md's Python sections, run as written
# (from `pip install ./client/python` in a fresh venv each) against one live server.
add_test(NAME python_readme_examples
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/readme_examples.py
          --readme=client/python/README.md --readme=README.md:python- --copy=client/python
          "--expect=install=Successfully installed attnserve-${PROJECT_VERSION}"
          "--expect=first-call=(1, 10, 64)"
          "--expect=load-module=4 (2, 5, 32) (2, 4, 5, 7)"
          "--expect=asyncio=8 (1, 4, 8, 16)"
          "--expect=stream=99 5 module: no module 'no-such-module'"
          "--expect=sessions=20 (1, 8, 64) 21"
          "--expect=throttle=(1, 1) 0.0"
          "--expect=python-install=Successfully installed attnserve-${PROJECT_VERSION}"
          "--expect=python-first-call=(1, 10, 64)"
          "--expect=python-reflection=AAAAQAAAQEA="
          ${CMAKE_CURRENT_BINARY_DIR}/readme-examples)
set_tests_properties(python_readme_examples PROPERTIES
  LABELS "python;client;integration"
  TIMEOUT 300
  ENVIRONMENT "ATTNSERVE_BIN=$<TARGET_FILE:attnserve>")

# README.md's C++ lines are quoted from tests/client/outside, which client_install_find_package
# builds against the installed package and runs against a live server: they must still be there.
add_test(NAME readme_quoted_examples
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/readme_examples.py --readme=README.md
          --quotes)
set_tests_properties(readme_quoted_examples PROPERTIES LABELS "client;unit" TIMEOUT 60)
