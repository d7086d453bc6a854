// Forwarding header, kept while branches that still name batching::Mutex are merged: the
// batcher's mutex is attnserve's one mutex type (base/mutex.h). New code includes base/mutex.h.
#ifndef ATTNSERVE_SERVER_BATCHING_SYNC_H_
#define ATTNSERVE_SERVER_BATCHING_SYNC_H_

#include "base/mutex.h"

namespace attnserve::batching {

using Mutex = ::attnserve::Mutex;
using MutexLock = ::attnserve::MutexLock;
using CondVar = ::attnserve::CondVar;

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_SYNC_H_
