// The Python module `npusim`: the npusim runtime (libascendcl.so) for Python workloads and tests.
// Device pointers and stream/event handles are ints; host data are numpy arrays. Every call that
// may block (copies, synchronizes, the snapshot gate) runs without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/eval.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "acl/acl.h"
#include "acl/npusim.h"
#include "hccl/hccl.h"

namespace py = pybind11;

namespace {

struct AclFailure {
  int code;
  std::string what;
};

py::object g_acl_error;  // the Python class npusim.AclError

void check(int rc, const char *what) {
  if (rc != ACL_SUCCESS) throw AclFailure{rc, what};
}

// Runs f without the GIL and raises AclError if it fails.
template <class F>
void call(const char *what, F f) {
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = f();
  }
  check(rc, what);
}

void *ptr(uint64_t p) { return reinterpret_cast<void *>(p); }
aclrtStream stream_of(uint64_t s) { return reinterpret_cast<aclrtStream>(s); }

py::buffer_info contiguous(const py::array &a, bool writable) {
  if (!(a.flags() & py::array::c_style)) throw py::value_error("array must be C-contiguous");
  if (writable && !a.writeable()) throw py::value_error("array must be writable");
  return a.request(writable);
}

py::object json_loads(const std::string &s) { return py::module_::import("json").attr("loads")(s); }

int pid_or_self(std::optional<int> pid) { return pid ? *pid : static_cast<int>(::getpid()); }

}  // namespace

PYBIND11_MODULE(npusim, m) {
  m.doc() = "npusim: the software NPU's AscendCL runtime for Python";

  py::dict ns;
  ns["__builtins__"] = py::module_::import("builtins");
  // Not starting with a newline: pybind11 would import textwrap to dedent it (1.5 ms on every import).
  py::exec(R"(class AclError(RuntimeError):
    """An AscendCL call failed; .code is the aclError value."""
    def __init__(self, code, call):
        super().__init__(f"{call} failed with aclError {code}")
        self.code = code
)", ns);
  g_acl_error = ns["AclError"];
  g_acl_error.attr("__module__") = "npusim";
  m.attr("AclError") = g_acl_error;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const AclFailure &e) {
      py::object inst = g_acl_error(e.code, e.what);
      PyErr_SetObject(g_acl_error.ptr(), inst.ptr());
    }
  });

  m.def("init", [](std::optional<std::string> config) {
    call("aclInit", [&] { return aclInit(config ? config->c_str() : nullptr); });
  }, py::arg("config") = py::none());
  m.def("finalize", [] { call("aclFinalize", [] { return aclFinalize(); }); });

  m.def("set_device", [](int32_t d) { call("aclrtSetDevice", [&] { return aclrtSetDevice(d); }); });
  m.def("get_device", [] {
    int32_t d = -1;
    call("aclrtGetDevice", [&] { return aclrtGetDevice(&d); });
    return d;
  });
  m.def("reset_device", [](int32_t d, bool force) {
    call("aclrtResetDevice", [&] { return force ? aclrtResetDeviceForce(d) : aclrtResetDevice(d); });
  }, py::arg("device"), py::arg("force") = false);
  m.def("get_device_count", [] {
    uint32_t n = 0;
    call("aclrtGetDeviceCount", [&] { return aclrtGetDeviceCount(&n); });
    return n;
  });
  m.def("synchronize_device", [] { call("aclrtSynchronizeDevice", [] { return aclrtSynchronizeDevice(); }); });
  m.def("get_mem_info", [](int attr) {
    size_t free = 0, total = 0;
    call("aclrtGetMemInfo", [&] { return aclrtGetMemInfo(static_cast<aclrtMemAttr>(attr), &free, &total); });
    return py::make_tuple(free, total);
  }, py::arg("attr") = static_cast<int>(ACL_HBM_MEM), "(free, total) bytes of the current device");
  m.def("device_can_access_peer", [](int32_t d, int32_t peer) {
    int32_t can = 0;
    call("aclrtDeviceCanAccessPeer", [&] { return aclrtDeviceCanAccessPeer(&can, d, peer); });
    return can != 0;
  });
  m.def("device_enable_peer_access", [](int32_t peer, uint32_t flags) {
    call("aclrtDeviceEnablePeerAccess", [&] { return aclrtDeviceEnablePeerAccess(peer, flags); });
  }, py::arg("peer"), py::arg("flags") = 0);
  m.def("device_disable_peer_access", [](int32_t peer) {
    call("aclrtDeviceDisablePeerAccess", [&] { return aclrtDeviceDisablePeerAccess(peer); });
  });

  m.def("malloc", [](size_t size, int policy) {
    void *p = nullptr;
    call("aclrtMalloc", [&] { return aclrtMalloc(&p, size, static_cast<aclrtMemMallocPolicy>(policy)); });
    return reinterpret_cast<uint64_t>(p);
  }, py::arg("size"), py::arg("policy") = static_cast<int>(ACL_MEM_MALLOC_HUGE_FIRST), "a device address");
  m.def("free", [](uint64_t p) { call("aclrtFree", [&] { return aclrtFree(ptr(p)); }); });

  // stream=None: a synchronous copy; an int (0: the default stream): queued on that stream, and
  // the array must stay alive and untouched until the stream is synchronized.
  m.def("memcpy_h2d", [](uint64_t dst, const py::array &src, std::optional<uint64_t> stream) {
    py::buffer_info b = contiguous(src, false);
    const size_t n = static_cast<size_t>(b.size * b.itemsize);
    call(stream ? "aclrtMemcpyAsync" : "aclrtMemcpy", [&] {
      return stream ? aclrtMemcpyAsync(ptr(dst), n, b.ptr, n, ACL_MEMCPY_HOST_TO_DEVICE, stream_of(*stream))
                    : aclrtMemcpy(ptr(dst), n, b.ptr, n, ACL_MEMCPY_HOST_TO_DEVICE);
    });
  }, py::arg("dst"), py::arg("src"), py::arg("stream") = py::none());
  m.def("memcpy_d2h", [](py::array dst, uint64_t src, std::optional<uint64_t> stream) {
    py::buffer_info b = contiguous(dst, true);
    const size_t n = static_cast<size_t>(b.size * b.itemsize);
    call(stream ? "aclrtMemcpyAsync" : "aclrtMemcpy", [&] {
      return stream ? aclrtMemcpyAsync(b.ptr, n, ptr(src), n, ACL_MEMCPY_DEVICE_TO_HOST, stream_of(*stream))
                    : aclrtMemcpy(b.ptr, n, ptr(src), n, ACL_MEMCPY_DEVICE_TO_HOST);
    });
  }, py::arg("dst"), py::arg("src"), py::arg("stream") = py::none());
  m.def("memcpy_d2d", [](uint64_t dst, uint64_t src, size_t count, std::optional<uint64_t> stream) {
    call(stream ? "aclrtMemcpyAsync" : "aclrtMemcpy", [&] {
      return stream ? aclrtMemcpyAsync(ptr(dst), count, ptr(src), count, ACL_MEMCPY_DEVICE_TO_DEVICE, stream_of(*stream))
                    : aclrtMemcpy(ptr(dst), count, ptr(src), count, ACL_MEMCPY_DEVICE_TO_DEVICE);
    });
  }, py::arg("dst"), py::arg("src"), py::arg("count"), py::arg("stream") = py::none());
  m.def("memset", [](uint64_t dst, int32_t value, size_t count, std::optional<uint64_t> stream) {
    call(stream ? "aclrtMemsetAsync" : "aclrtMemset", [&] {
      return stream ? aclrtMemsetAsync(ptr(dst), count, value, count, stream_of(*stream))
                    : aclrtMemset(ptr(dst), count, value, count);
    });
  }, py::arg("dst"), py::arg("value"), py::arg("count"), py::arg("stream") = py::none());

  m.def("create_stream", [] {
    aclrtStream s = nullptr;
    call("aclrtCreateStream", [&] { return aclrtCreateStream(&s); });
    return reinterpret_cast<uint64_t>(s);
  });
  m.def("destroy_stream", [](uint64_t s, bool force) {
    call("aclrtDestroyStream", [&] { return force ? aclrtDestroyStreamForce(stream_of(s)) : aclrtDestroyStream(stream_of(s)); });
  }, py::arg("stream"), py::arg("force") = false);
  m.def("synchronize_stream", [](uint64_t s) {
    call("aclrtSynchronizeStream", [&] { return aclrtSynchronizeStream(stream_of(s)); });
  }, py::arg("stream") = 0);
  m.def("stream_wait_event", [](uint64_t s, uint64_t e) {
    call("aclrtStreamWaitEvent", [&] { return aclrtStreamWaitEvent(stream_of(s), ptr(e)); });
  });
  m.def("create_event", [] {
    aclrtEvent e = nullptr;
    call("aclrtCreateEvent", [&] { return aclrtCreateEvent(&e); });
    return reinterpret_cast<uint64_t>(e);
  });
  m.def("destroy_event", [](uint64_t e) { call("aclrtDestroyEvent", [&] { return aclrtDestroyEvent(ptr(e)); }); });
  m.def("record_event", [](uint64_t e, uint64_t s) {
    call("aclrtRecordEvent", [&] { return aclrtRecordEvent(ptr(e), stream_of(s)); });
  }, py::arg("event"), py::arg("stream") = 0);
  m.def("synchronize_event", [](uint64_t e) {
    call("aclrtSynchronizeEvent", [&] { return aclrtSynchronizeEvent(ptr(e)); });
  });
  m.def("event_elapsed_time", [](uint64_t a, uint64_t b) {
    float ms = 0;
    call("aclrtEventElapsedTime", [&] { return aclrtEventElapsedTime(&ms, ptr(a), ptr(b)); });
    return ms;
  });

  m.def("launch_fill", [](uint64_t dst, size_t count, float value, uint64_t s) {
    call("npusimLaunchFill", [&] { return npusimLaunchFill(ptr(dst), count, value, stream_of(s)); });
  }, py::arg("dst"), py::arg("count"), py::arg("value"), py::arg("stream") = 0);
  m.def("launch_copy", [](uint64_t dst, uint64_t src, size_t size, uint64_t s) {
    call("npusimLaunchCopy", [&] { return npusimLaunchCopy(ptr(dst), ptr(src), size, stream_of(s)); });
  }, py::arg("dst"), py::arg("src"), py::arg("size"), py::arg("stream") = 0);
  m.def("launch_axpy", [](size_t n, float alpha, uint64_t x, uint64_t y, uint64_t s) {
    call("npusimLaunchAxpy", [&] { return npusimLaunchAxpy(n, alpha, ptr(x), ptr(y), stream_of(s)); });
  }, py::arg("n"), py::arg("alpha"), py::arg("x"), py::arg("y"), py::arg("stream") = 0);
  m.def("launch_matmul", [](size_t mm, size_t n, size_t k, uint64_t a, uint64_t b, uint64_t c, uint64_t s) {
    call("npusimLaunchMatmul", [&] { return npusimLaunchMatmul(mm, n, k, ptr(a), ptr(b), ptr(c), stream_of(s)); });
  }, py::arg("m"), py::arg("n"), py::arg("k"), py::arg("a"), py::arg("b"), py::arg("c"), py::arg("stream") = 0);

  // HCCL (libhccl.so), for data-parallel Python workloads: a communicator is an int handle, the
  // root info is opaque bytes that rank 0 hands the others (a file, an env var, a store).
  m.attr("HCCL_DATA_TYPE_FP32") = static_cast<int>(HCCL_DATA_TYPE_FP32);
  m.attr("HCCL_REDUCE_SUM") = static_cast<int>(HCCL_REDUCE_SUM);
  m.def("hccl_get_root_info", [] {
    HcclRootInfo info{};
    call("HcclGetRootInfo", [&] { return static_cast<int>(HcclGetRootInfo(&info)); });
    return py::bytes(info.internal, sizeof info.internal);
  });
  m.def("hccl_comm_init_root_info", [](uint32_t nranks, const py::bytes &root, uint32_t rank) {
    std::string raw = root;
    HcclRootInfo info{};
    if (raw.size() != sizeof info.internal) throw py::value_error("root info must be HCCL_ROOT_INFO_BYTES long");
    raw.copy(info.internal, sizeof info.internal);
    HcclComm comm = nullptr;
    call("HcclCommInitRootInfo", [&] { return static_cast<int>(HcclCommInitRootInfo(nranks, &info, rank, &comm)); });
    return reinterpret_cast<uint64_t>(comm);
  }, py::arg("nranks"), py::arg("root_info"), py::arg("rank"));
  m.def("hccl_comm_destroy", [](uint64_t comm) {
    call("HcclCommDestroy", [&] { return static_cast<int>(HcclCommDestroy(reinterpret_cast<HcclComm>(comm))); });
  });
  m.def("hccl_all_reduce", [](uint64_t send, uint64_t recv, uint64_t count, int dtype, int op, uint64_t comm,
                              uint64_t s) {
    call("HcclAllReduce", [&] {
      return static_cast<int>(HcclAllReduce(ptr(send), ptr(recv), count, static_cast<HcclDataType>(dtype),
                                            static_cast<HcclReduceOp>(op), reinterpret_cast<HcclComm>(comm),
                                            stream_of(s)));
    });
  }, py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("comm"),
     py::arg("stream"));

  // pid defaults to this process; reserve is passed through as a raw pointer value, so tests can
  // exercise CANN's argument checks.
  m.def("snapshot_lock", [](std::optional<int> pid, uint64_t reserve) {
    call("aclrtSnapShotProcessLock", [&] { return aclrtSnapShotProcessLock(pid_or_self(pid), ptr(reserve)); });
  }, py::arg("pid") = py::none(), py::arg("reserve") = 0);
  m.def("snapshot_backup", [](std::optional<int> pid) {
    call("aclrtSnapShotProcessBackup", [&] { return aclrtSnapShotProcessBackup(pid_or_self(pid), nullptr); });
  }, py::arg("pid") = py::none());
  m.def("snapshot_restore", [](std::optional<int> pid) {
    call("aclrtSnapShotProcessRestore", [&] { return aclrtSnapShotProcessRestore(pid_or_self(pid), nullptr); });
  }, py::arg("pid") = py::none());
  m.def("snapshot_unlock", [](std::optional<int> pid, uint64_t reserve) {
    call("aclrtSnapShotProcessUnlock", [&] { return aclrtSnapShotProcessUnlock(pid_or_self(pid), ptr(reserve)); });
  }, py::arg("pid") = py::none(), py::arg("reserve") = 0);
  m.def("snapshot_info", [] {
    char buf[1024];
    int n;
    {
      py::gil_scoped_release nogil;
      n = npusimSnapshotInfo(buf, sizeof(buf));
    }
    check(n < 0 ? -n : ACL_SUCCESS, "npusimSnapshotInfo");
    return json_loads(std::string(buf, static_cast<size_t>(n)));
  });

  m.def("daemon_status", [](const std::string &socket) {
    std::string buf(4096, '\0');
    size_t needed = 0;
    int rc;
    for (;;) {
      {
        py::gil_scoped_release nogil;
        rc = npusimDaemonStatus(socket.c_str(), buf.data(), buf.size(), &needed);
      }
      if (rc != ACL_ERROR_INVALID_PARAM || needed + 1 <= buf.size()) break;
      buf.resize(needed + 1);
    }
    check(rc, "npusimDaemonStatus");
    return json_loads(buf.substr(0, needed));
  }, py::arg("socket_path"), "the daemon's status as a dict (devices, clients)");
  m.def("daemon_shutdown", [](const std::string &socket) {
    call("npusimDaemonShutdown", [&] { return npusimDaemonShutdown(socket.c_str()); });
  }, py::arg("socket_path"));

  // The direct path (npusim.h): the daemon moves a locked client's device memory to/from files.
  // Failures raise OSError(errno, message) for file-system errors (ENOSPC, EACCES, ...) and
  // AclError with the daemon's message otherwise (client not locked, corrupt image, ...).
  auto transfer = [](const char *what, py::object result_of, int rc, char *json) -> py::object {
    std::string text = json != nullptr ? json : "";
    std::free(json);
    py::object data = text.empty() ? py::dict() : json_loads(text);
    (void)result_of;
    if (rc == ACL_SUCCESS) return data;
    py::dict d = data.cast<py::dict>();
    std::string msg = d.contains("error") ? d["error"].cast<std::string>() : std::string(what) + " failed";
    int err = d.contains("errno") ? d["errno"].cast<int>() : 0;
    if (err != 0) {
      py::object e = py::module_::import("builtins").attr("OSError")(err, msg);
      PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(e.ptr())), e.ptr());
      throw py::error_already_set();
    }
    py::object e = g_acl_error(rc, what);
    e.attr("args") = py::make_tuple(std::string(what) + ": " + msg + " (aclError " + std::to_string(rc) + ")");
    PyErr_SetObject(g_acl_error.ptr(), e.ptr());
    throw py::error_already_set();
  };
  auto abspath = [](const py::object &p) {
    py::module_ os = py::module_::import("os");
    return os.attr("path").attr("abspath")(os.attr("fspath")(p)).cast<std::string>();
  };
  m.def("export_client", [transfer, abspath](const std::string &socket, int pid, const py::object &dir,
                                             const py::object &parent, bool sync, bool keep, bool from_snapshot) {
    const std::string d = dir.is_none() ? std::string() : abspath(dir);
    const std::string pd = parent.is_none() ? std::string() : abspath(parent);
    char *json = nullptr;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = npusimDaemonExportFlags(socket.c_str(), pid, dir.is_none() ? nullptr : d.c_str(),
                                   pd.empty() ? nullptr : pd.c_str(),
                                   (sync ? 0u : NPUSIM_EXPORT_NO_SYNC) | (keep ? NPUSIM_EXPORT_KEEP : 0u) |
                                       (from_snapshot ? NPUSIM_EXPORT_SNAPSHOT : 0u), &json);
    }
    return transfer("npusim.export_client", py::none(), rc, json);
  }, py::arg("socket_path"), py::arg("pid"), py::arg("directory"), py::arg("parent") = py::none(),
     py::arg("sync") = true, py::arg("keep") = false, py::arg("from_snapshot") = false,
     "write the device memory of locked client pid into directory (dev<N>.img per device); with parent (a "
     "directory of an earlier export's images) only what changed since; sync=False: the caller fsyncs the "
     "files and the directory itself before relying on them; keep: the daemon keeps the memory across the "
     "next Release for the external restore that follows (no import then); returns "
     "{files: [{path, size, checksum}], allocations, bytes, nonzero_bytes, referenced_bytes, written_bytes, seconds}; "
     "from_snapshot: the images of client pid's snapshot (snapshot_client), which ends with this call (directory "
     "None: it just ends)");
  m.def("snapshot_client", [transfer](const std::string &socket, int pid, uint64_t cap) {
    char *json = nullptr;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = npusimDaemonSnapshot(socket.c_str(), pid, cap, &json);
    }
    return transfer("npusim.snapshot_client", py::none(), rc, json);
  }, py::arg("socket_path"), py::arg("pid"), py::arg("cap"),
     "snapshot the device memory of locked client pid copy-on-write in the daemon (at most cap bytes of copies; "
     "a write beyond waits for the write-out), kept across the next Release like keep; export_client(..., "
     "from_snapshot=True) writes its images; returns {files: [], allocations, bytes, snapshot: true}");
  m.def("import_client", [transfer, abspath](const std::string &socket, int pid, const py::object &dir,
                                             std::optional<std::vector<std::tuple<std::string, uint64_t, std::string>>> expected,
                                             const py::object &ancestors, bool lazy, uint64_t ahead_of,
                                             bool if_due) {
    const std::string d = abspath(dir);
    std::string lines, chain;
    if (expected)
      for (auto &[name, size, sum] : *expected) lines += name + " " + std::to_string(size) + " " + sum + "\n";
    if (!ancestors.is_none())
      for (auto &a : ancestors) chain += abspath(py::reinterpret_borrow<py::object>(a)) + "\n";
    char *json = nullptr;
    int rc;
    {
      py::gil_scoped_release nogil;
      const char *want = expected ? lines.c_str() : nullptr;
      if (ahead_of != 0)
        rc = npusimDaemonImportAhead(socket.c_str(), pid, ahead_of, d.c_str(), want, chain.c_str(), &json);
      else
        rc = (lazy ? npusimDaemonImportLazy : if_due ? npusimDaemonImportIfDue : npusimDaemonImportChain)(
            socket.c_str(), pid, d.c_str(), want, chain.c_str(), &json);
    }
    return transfer("npusim.import_client", py::none(), rc, json);
  }, py::arg("socket_path"), py::arg("pid"), py::arg("directory"), py::arg("expected") = py::none(),
     py::arg("ancestors") = py::none(), py::arg("lazy") = false, py::arg("ahead_of") = 0, py::arg("if_due") = false,
     "read device images from directory into the (re-created, locked) allocations of client pid; "
     "expected: [(name, size, xxh3_128 hex)] to read exactly those files and refuse any mismatch; "
     "lazy: return before the data is in (chunks come on first touch and in the background, checked); "
     "ahead_of: the start time of process pid, not yet reconnected (CRIU restores it): the data goes into "
     "memory kept for its external restore to take back; if_due: nothing read when no import is due");
  m.def("lazy_status", [transfer](const std::string &socket, int pid, int wait_ms) {
    char *json = nullptr;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = npusimDaemonLazyStatus(socket.c_str(), pid, wait_ms, &json);
    }
    return transfer("npusim.lazy_status", py::none(), rc, json);
  }, py::arg("socket_path"), py::arg("pid"), py::arg("wait_ms") = 0,
     "the lazy import of client pid: {state: none|filling|done|failed, chunks, ready, bad, bytes, seconds, errors}, "
     "waiting up to wait_ms for its end");
  m.def("snapshot_set_data_path", [](bool external) {
    call("npusimSnapshotSetDataPath", [&] { return npusimSnapshotSetDataPath(external ? 1 : 0); });
  }, py::arg("external"));

  m.attr("ACL_SUCCESS") = ACL_SUCCESS;
  m.attr("ACL_DDR_MEM") = static_cast<int>(ACL_DDR_MEM);
  m.attr("ACL_HBM_MEM") = static_cast<int>(ACL_HBM_MEM);
}
