# The metrics of a live attnserve: promtool on a scrape of the real server, a real Prometheus
# (started by the test on loopback) scraping it through a known load, and /metrics under load.
# Included from tests/python/CMakeLists.txt. Needs Debian's `prometheus` package (prometheus and
# promtool); without it the script exits 77 and ctest reports the test as skipped.
add_test(NAME python_metrics_live
  COMMAND /usr/bin/python3 test_metrics_live.py -v
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(python_metrics_live PROPERTIES
  LABELS "metrics;integration"
  SKIP_RETURN_CODE 77
  TIMEOUT 180
  ENVIRONMENT "ATTNSERVE_BIN=$<TARGET_FILE:attnserve>;ATTNSERVE_STUBS=${CMAKE_BINARY_DIR}/python/attnserve_pb;PYTHONDONTWRITEBYTECODE=1")
