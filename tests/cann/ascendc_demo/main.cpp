// The host program of the AscendC demo project. Each step launches three kernels of the library
// demo_kernels, each a different way: scale_add through ACLRT_LAUNCH_KERNEL (the generated
// aclrtlaunch_scale_add.h), blend through its <<<>>> wrapper (run by blend.npusim.cpp), and
// scale_add again from the fatbin file with aclrtKernelArgs; then it checks both buffers against
// the same arithmetic done on the host and prints their hash. The output depends only on the step.
// Usage: demo steps STEPS SLEEP_MS FATBIN | demo missing | demo print
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "acl/acl.h"
#include "aclrtlaunch_scale_add.h"
#include "kernels/demo_kernels.h"
#include "step_gate.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        aclError rc_ = (aclError)(x);                                                              \
        if (rc_ != ACL_SUCCESS) {                                                                  \
            std::fprintf(stderr, "demo: line %d: %s = %d (%s)\n", __LINE__, #x, rc_,               \
                         aclGetRecentErrMsg() ? aclGetRecentErrMsg() : "");                       \
            std::exit(3);                                                                          \
        }                                                                                          \
    } while (0)

namespace {
constexpr uint32_t N = 2048;

uint64_t fnv(const void* p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ULL;
    return h;
}

int missing()
{
    CHECK(aclInit(nullptr));
    CHECK(aclrtSetDevice(0));
    aclrtStream stream;
    CHECK(aclrtCreateStream(&stream));
    void* x;
    CHECK(aclrtMalloc(&x, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    const uint32_t rc = MissingDo(1, stream, static_cast<float*>(x));
    const char* msg = aclGetRecentErrMsg();
    std::printf("rc %u\nmessage %s\n", rc, msg ? msg : "(none)");
    CHECK(aclrtFree(x));
    CHECK(aclrtDestroyStream(stream));
    CHECK(aclrtResetDeviceForce(0));
    CHECK(aclFinalize());
    return rc == 207000 ? 0 : 1;
}

int print()
{
    CHECK(aclInit(nullptr));
    CHECK(aclrtSetDevice(0));
    aclrtStream stream;
    CHECK(aclrtCreateStream(&stream));
    std::printf("before\n");
    std::fflush(stdout);
    CHECK(GreetDo(4, stream, 7));
    CHECK(aclrtSynchronizeStream(stream));
    std::printf("after\n");
    CHECK(aclrtDestroyStream(stream));
    CHECK(aclrtResetDeviceForce(0));
    CHECK(aclFinalize());
    return 0;
}

int steps(int count, int sleepMs, const char* fatbin)
{
    CHECK(aclInit(nullptr));
    CHECK(aclrtSetDevice(0));
    aclrtStream stream;
    CHECK(aclrtCreateStream(&stream));
    void *x, *y, *z;
    CHECK(aclrtMalloc(&x, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&y, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&z, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    std::vector<float> hx(N), hy(N), hz(N, 0.0f), dy(N), dz(N);
    for (uint32_t i = 0; i < N; ++i) {
        hx[i] = static_cast<float>(i % 97) * 0.125f - 3.0f;
        hy[i] = static_cast<float>(i % 13) * 0.5f;
    }
    CHECK(aclrtMemcpy(x, N * 4, hx.data(), N * 4, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtMemcpy(y, N * 4, hy.data(), N * 4, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtMemcpy(z, N * 4, hz.data(), N * 4, ACL_MEMCPY_HOST_TO_DEVICE));

    aclrtBinHandle bin;
    aclrtFuncHandle fn;
    CHECK(aclrtBinaryLoadFromFile(fatbin, nullptr, &bin));
    CHECK(aclrtBinaryGetFunction(bin, "scale_add", &fn));
    std::printf("ready pid %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);

    for (int s = 0; s < count; ++s) {
        const float alpha = 0.5f + 0.25f * static_cast<float>(s % 4);
        // z = alpha * x + y
        CHECK(ACLRT_LAUNCH_KERNEL(scale_add)(8, stream, x, y, z, alpha, N));
        // z = 0.5 * z + x
        CHECK(BlendDo(4, stream, static_cast<float*>(x), static_cast<float*>(z), N));
        // y = 0.25 * z + y, from the fatbin
        aclrtArgsHandle args;
        aclrtParamHandle p;
        float quarter = 0.25f;
        uint32_t n = N;
        CHECK(aclrtKernelArgsInit(fn, &args));
        CHECK(aclrtKernelArgsAppend(args, &z, sizeof z, &p));
        CHECK(aclrtKernelArgsAppend(args, &y, sizeof y, &p));
        CHECK(aclrtKernelArgsAppend(args, &y, sizeof y, &p));
        CHECK(aclrtKernelArgsAppend(args, &quarter, sizeof quarter, &p));
        CHECK(aclrtKernelArgsAppend(args, &n, sizeof n, &p));
        CHECK(aclrtKernelArgsFinalize(args));
        CHECK(aclrtLaunchKernelWithConfig(fn, 4, stream, nullptr, args, nullptr));
        CHECK(aclrtSynchronizeStream(stream));
        CHECK(aclrtMemcpy(dz.data(), N * 4, z, N * 4, ACL_MEMCPY_DEVICE_TO_HOST));
        CHECK(aclrtMemcpy(dy.data(), N * 4, y, N * 4, ACL_MEMCPY_DEVICE_TO_HOST));
        for (uint32_t i = 0; i < N; ++i) {
            float c = hx[i] * alpha;
            hz[i] = c + hy[i];
            hz[i] = 0.5f * hz[i] + hx[i];
            c = hz[i] * quarter;
            hy[i] = c + hy[i];
        }
        const bool same = std::memcmp(dz.data(), hz.data(), N * 4) == 0 && std::memcmp(dy.data(), hy.data(), N * 4) == 0;
        std::printf("step %d %016llx %016llx %s\n", s, static_cast<unsigned long long>(fnv(dz.data(), N * 4)),
                    static_cast<unsigned long long>(fnv(dy.data(), N * 4)), same ? "match" : "MISMATCH");
        std::fflush(stdout);
        if (!same) return 4;
        if (sleepMs > 0) usleep(static_cast<useconds_t>(sleepMs) * 1000);
        step_gate(s);
    }
    CHECK(aclrtBinaryUnLoad(bin));
    CHECK(aclrtFree(x));
    CHECK(aclrtFree(y));
    CHECK(aclrtFree(z));
    CHECK(aclrtDestroyStream(stream));
    CHECK(aclrtResetDeviceForce(0));
    CHECK(aclFinalize());
    std::printf("done\n");
    return 0;
}
} // namespace

int main(int argc, char** argv)
{
    if (argc == 2 && std::strcmp(argv[1], "missing") == 0) return missing();
    if (argc == 2 && std::strcmp(argv[1], "print") == 0) return print();
    if (argc == 5 && std::strcmp(argv[1], "steps") == 0) return steps(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
    std::fprintf(stderr, "usage: demo steps STEPS SLEEP_MS FATBIN | demo missing | demo print\n");
    return 2;
}
