// jemalloc's settings for the servers that link it (base/CMakeLists.txt: attnserve_allocator).
// jemalloc reads malloc_conf when it starts, before main; MALLOC_CONF in the environment still
// overrides any of it. Measured in tests/bench/SERVING.md ("The allocator"), in short:
//   narenas:1             every thread allocates from one arena. gRPC allocates a request's read
//                         buffers on its threads and the server frees them on others; jemalloc
//                         returns a freed block to the arena it came from, so with its default
//                         of 4 arenas per core the allocating threads' arenas kept asking the
//                         system for fresh pages while the others filled with free ones (RSS
//                         grew without bound with decay off; with decay on, 16 MiB requests
//                         faulted ~300 pages a call). Small blocks still go through each thread's
//                         cache, so one arena costs no lock on the common path.
//   background_thread:true  a thread of jemalloc's returns free pages to the system as they age
//                         (dirty_decay_ms, 10 s by default), also while the server is idle:
//                         idle memory comes back within about that time, never per request.
//   oversize_threshold:0  blocks of 8 MiB and more are reused like the others (by default they
//                         go to an arena that keeps no free pages: every 16 MiB request faulted
//                         all of its pages in again).
extern "C" {
// NOLINTNEXTLINE: the name is jemalloc's.
const char* malloc_conf = "narenas:1,background_thread:true,oversize_threshold:0";
}
