// libopapi.so: aclnnAdd and aclnnMul, computed by an npusim kernel (ops_kernels.c, installed next
// to this library as npusim/opapi_kernels.so) that is loaded and launched through the public
// runtime API, like any application's kernel: so it runs in the process's kernel runner and the
// snapshot carries it as one more binary.
#include <dlfcn.h>

#include <algorithm>
#include <mutex>
#include <new>
#include <string>

#include "acl/acl.h"
#include "aclnnop/aclnn_add.h"
#include "aclnnop/aclnn_mul.h"
#include "tensor.h"

using npusim::aclnn::contiguous;
using npusim::aclnn::element_count;

struct npusim_binop_args {  // as in ops_kernels.c
  uint64_t self, other, out, count;
  double alpha;
  uint32_t op;
  uint32_t dtype;
};

struct aclOpExecutor {
  npusim_binop_args args;
};

namespace {

std::mutex g_mu;
aclrtBinHandle g_binary = nullptr;
aclrtFuncHandle g_binop = nullptr;

std::string kernels_path() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void *>(&kernels_path), &info) == 0 || info.dli_fname == nullptr) return {};
  std::string self = info.dli_fname;
  return self.substr(0, self.rfind('/') + 1) + "npusim/opapi_kernels.so";
}

// The operators' kernel, loaded once per process (again after aclFinalize/aclInit).
aclError binop_function(aclrtFuncHandle *out) {
  std::lock_guard<std::mutex> g(g_mu);
  char name[32];
  if (g_binop != nullptr && aclrtGetFunctionName(g_binop, sizeof(name), name) == ACL_SUCCESS) {
    *out = g_binop;
    return ACL_SUCCESS;
  }
  if (aclError rc = aclrtBinaryLoadFromFile(kernels_path().c_str(), nullptr, &g_binary); rc != ACL_SUCCESS) return rc;
  if (aclError rc = aclrtBinaryGetFunction(g_binary, "npusim_binop", &g_binop); rc != ACL_SUCCESS) return rc;
  *out = g_binop;
  return ACL_SUCCESS;
}

bool same_shape(const aclTensor *a, const aclTensor *b) { return a->view == b->view; }

uint64_t address(const aclTensor *t) {
  return reinterpret_cast<uint64_t>(t->data) + static_cast<uint64_t>(t->offset) * 4;
}

aclnnStatus prepare(const aclTensor *self, const aclTensor *other, const aclScalar *alpha, aclTensor *out, uint32_t op,
                    uint64_t *workspaceSize, aclOpExecutor **executor) {
  if (self == nullptr || other == nullptr || out == nullptr || workspaceSize == nullptr || executor == nullptr ||
      (op == 0 && alpha == nullptr))
    return ACLNN_ERR_PARAM_NULLPTR;
  const aclDataType t = self->dtype;
  if ((t != ACL_FLOAT && t != ACL_INT32) || other->dtype != t || out->dtype != t) return ACLNN_ERR_PARAM_INVALID;
  if (!same_shape(self, other) || !same_shape(self, out)) return ACLNN_ERR_PARAM_INVALID;  // no broadcasting
  if (!contiguous(*self) || !contiguous(*other) || !contiguous(*out) || element_count(*self) < 0)
    return ACLNN_ERR_PARAM_INVALID;
  auto *e = new (std::nothrow) aclOpExecutor{};
  if (e == nullptr) return ACLNN_ERR_INNER;
  e->args = npusim_binop_args{address(self), address(other), address(out), static_cast<uint64_t>(element_count(*self)),
                              op == 0 ? alpha->value : 1.0, op, static_cast<uint32_t>(t)};
  *workspaceSize = 0;
  *executor = e;
  return ACLNN_SUCCESS;
}

// Runs and frees the executor (CANN's executors are for one run).
aclnnStatus run(aclOpExecutor *executor, aclrtStream stream) {
  if (executor == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  aclrtFuncHandle f = nullptr;
  aclError rc = binop_function(&f);
  if (rc == ACL_SUCCESS && executor->args.count > 0) {
    const uint32_t blocks = static_cast<uint32_t>(std::clamp<uint64_t>(executor->args.count / 16384, 1, 8));
    rc = aclrtLaunchKernel(f, blocks, &executor->args, sizeof(executor->args), stream);
  }
  delete executor;
  return rc == ACL_SUCCESS ? ACLNN_SUCCESS : rc;
}

}  // namespace

extern "C" {

aclnnStatus aclnnAddGetWorkspaceSize(const aclTensor *self, const aclTensor *other, const aclScalar *alpha,
                                     aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor) {
  return prepare(self, other, alpha, out, 0, workspaceSize, executor);
}

aclnnStatus aclnnAdd(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream) {
  (void)workspace;
  (void)workspaceSize;  // npusim's operators need no workspace
  return run(executor, stream);
}

aclnnStatus aclnnMulGetWorkspaceSize(const aclTensor *self, const aclTensor *other, aclTensor *out,
                                     uint64_t *workspaceSize, aclOpExecutor **executor) {
  return prepare(self, other, nullptr, out, 1, workspaceSize, executor);
}

aclnnStatus aclnnMul(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream) {
  (void)workspace;
  (void)workspaceSize;
  return run(executor, stream);
}

}  // extern "C"
