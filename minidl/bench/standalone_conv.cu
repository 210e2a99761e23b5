// ---- the program around the launches: minidl/bench/standalone_conv.cu, pasted by minidl.bench.standalone ----
// One convolution pass (NHWC activations, KRSC weights) run the way its launcher runs it, checked
// against a float64 loop on the host and timed with CUDA events. The part below the kernel source
// that is generated for one plan defines PROBLEM, BUFFERS, prepare_kernels() and run_plan().
//
// Without nvcc (-DSTANDALONE_HOST_ONLY, any C++17 compiler) the same file is the host half alone:
//   PROGRAM write DIR     the inputs as the kernel gets them (a.bin, b.bin) and the float64
//                         reference of every output element (reference.bin)
//   PROGRAM check FILE    the check below applied to an output read from FILE (exit 0: it passes)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef STANDALONE_CHECK_MACS
#define STANDALONE_CHECK_MACS 1000000000LL  // the reference's budget of multiply-adds (see check)
#endif

enum Pass { CONV_FWD, CONV_DGRAD, CONV_WGRAD };
enum Element { F32, BF16 };
enum Role { OPERAND_A, OPERAND_B, OUTPUT, WORK };  // fwd: x, w -> y; dgrad: dy, w -> dx; wgrad: x, dy -> dw

struct Problem {
    const char* label;
    Pass pass;
    int N, H, W, C, K, R, S, P, Q, stride, pad;
    double tolerance;  // max |out - reference| / max |reference| allowed
};
struct Buffer {
    const char* name;
    Role role;
    Element element;
    long long count;  // elements
};

extern const Problem PROBLEM;
extern const Buffer BUFFERS[];
extern const int BUFFER_COUNT;

static size_t element_bytes(Element e) { return e == BF16 ? 2 : 4; }

static float bf16_value(uint16_t bits) {
    uint32_t word = uint32_t(bits) << 16;
    float value;
    memcpy(&value, &word, 4);
    return value;
}

static uint16_t bf16_bits(float value) {  // round to nearest even, as __float2bfloat16 (finite values)
    uint32_t word;
    memcpy(&word, &value, 4);
    return uint16_t((word + 0x7FFFu + ((word >> 16) & 1u)) >> 16);
}

static uint64_t next_random(uint64_t& state) {  // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// One buffer on the host: its bytes as the kernel reads or writes them, and their values.
struct HostArray {
    std::vector<unsigned char> bytes;
    std::vector<float> values;
};

static HostArray decode(const Buffer& buffer, std::vector<unsigned char> bytes) {
    HostArray array{std::move(bytes), std::vector<float>(buffer.count)};
    for (long long i = 0; i < buffer.count; ++i) {
        if (buffer.element == BF16) {
            uint16_t bits;
            memcpy(&bits, &array.bytes[i * 2], 2);
            array.values[i] = bf16_value(bits);
        } else {
            memcpy(&array.values[i], &array.bytes[i * 4], 4);
        }
    }
    return array;
}

// Uniform in [-1, 1), rounded to bf16 for bf16 data: the kernel and the reference see the same values.
static HostArray random_array(const Buffer& buffer, uint64_t seed) {
    std::vector<unsigned char> bytes(buffer.count * element_bytes(buffer.element));
    uint64_t state = seed;
    for (long long i = 0; i < buffer.count; ++i) {
        float value = float(int64_t(next_random(state) >> 40) - (1 << 23)) / float(1 << 23);
        if (buffer.element == BF16) {
            uint16_t bits = bf16_bits(value);
            memcpy(&bytes[i * 2], &bits, 2);
        } else {
            memcpy(&bytes[i * 4], &value, 4);
        }
    }
    return decode(buffer, std::move(bytes));
}

static const Buffer& buffer_of(Role role) {
    for (int i = 0; i < BUFFER_COUNT; ++i)
        if (BUFFERS[i].role == role) return BUFFERS[i];
    fprintf(stderr, "the plan has no buffer of role %d\n", int(role));
    exit(2);
}

struct Inputs {
    HostArray a, b;
};

static Inputs make_inputs(uint64_t seed) {
    return {random_array(buffer_of(OPERAND_A), 2 * seed), random_array(buffer_of(OPERAND_B), 2 * seed + 1)};
}

// ---- the float64 reference, one output element at a time ----
static long long output_count(const Problem& p) {
    if (p.pass == CONV_FWD) return (long long)p.N * p.P * p.Q * p.K;
    if (p.pass == CONV_DGRAD) return (long long)p.N * p.H * p.W * p.C;
    return (long long)p.K * p.R * p.S * p.C;
}

static long long multiply_adds_per_element(const Problem& p) {
    if (p.pass == CONV_FWD) return (long long)p.R * p.S * p.C;
    if (p.pass == CONV_DGRAD) return (long long)p.R * p.S * p.K;
    return (long long)p.N * p.P * p.Q;
}

// fwd:   y[n,p,q,k]  = sum_{r,s,c} x[n, p*stride - pad + r, q*stride - pad + s, c] w[k,r,s,c]   (a = x, b = w)
// dgrad: dx[n,h,w,c] = sum over the (p, q, r, s) with h = p*stride - pad + r, w likewise,
//                      of sum_k dy[n,p,q,k] w[k,r,s,c]                                          (a = dy, b = w)
// wgrad: dw[k,r,s,c] = sum_{n,p,q} dy[n,p,q,k] x[n, p*stride - pad + r, q*stride - pad + s, c]  (a = x, b = dy)
static double reference_element(const Problem& p, const float* a, const float* b, long long i) {
    double sum = 0.0;
    if (p.pass == CONV_FWD) {
        const int k = int(i % p.K), q = int(i / p.K % p.Q), pp = int(i / p.K / p.Q % p.P);
        const long long n = i / p.K / p.Q / p.P;
        for (int r = 0; r < p.R; ++r)
            for (int s = 0; s < p.S; ++s) {
                const int h = pp * p.stride - p.pad + r, w = q * p.stride - p.pad + s;
                if (h < 0 || h >= p.H || w < 0 || w >= p.W) continue;
                const float* x = a + ((n * p.H + h) * p.W + w) * p.C;
                const float* wt = b + (((long long)k * p.R + r) * p.S + s) * p.C;
                for (int c = 0; c < p.C; ++c) sum += double(x[c]) * wt[c];
            }
    } else if (p.pass == CONV_DGRAD) {
        const int c = int(i % p.C), w = int(i / p.C % p.W), h = int(i / p.C / p.W % p.H);
        const long long n = i / p.C / p.W / p.H;
        for (int r = 0; r < p.R; ++r)
            for (int s = 0; s < p.S; ++s) {
                const int ph = h + p.pad - r, qw = w + p.pad - s;
                if (ph < 0 || qw < 0 || ph % p.stride || qw % p.stride) continue;
                const int pp = ph / p.stride, q = qw / p.stride;
                if (pp >= p.P || q >= p.Q) continue;
                const float* dy = a + ((n * p.P + pp) * p.Q + q) * p.K;
                for (int k = 0; k < p.K; ++k) sum += double(dy[k]) * b[(((long long)k * p.R + r) * p.S + s) * p.C + c];
            }
    } else {
        const int c = int(i % p.C), s = int(i / p.C % p.S), r = int(i / p.C / p.S % p.R);
        const long long k = i / p.C / p.S / p.R;
        for (long long n = 0; n < p.N; ++n)
            for (int pp = 0; pp < p.P; ++pp)
                for (int q = 0; q < p.Q; ++q) {
                    const int h = pp * p.stride - p.pad + r, w = q * p.stride - p.pad + s;
                    if (h < 0 || h >= p.H || w < 0 || w >= p.W) continue;
                    sum += double(a[((n * p.H + h) * p.W + w) * p.C + c]) * b[((n * p.P + pp) * p.Q + q) * p.K + k];
                }
    }
    return sum;
}

// ---- the check ----
struct Verdict {
    bool passed;
    long long unwritten, first_unwritten, checked;  // unwritten: not finite (the output starts as NaN)
    double max_error, max_reference;                // over the finite elements checked
    long long worst;
};

// Every output element must be finite. The reference is computed for every element when that
// costs at most STANDALONE_CHECK_MACS multiply-adds, else for the first and the last element and a
// fixed pseudo-random sample of the others within that budget.
static Verdict check(const Problem& p, const Inputs& in, const std::vector<float>& out) {
    const long long count = output_count(p);
    Verdict v{false, 0, -1, 0, 0.0, 0.0, -1};
    for (long long i = count - 1; i >= 0; --i)
        if (!std::isfinite(out[i])) ++v.unwritten, v.first_unwritten = i;
    const long long budget = std::max(2LL, STANDALONE_CHECK_MACS / std::max(1LL, multiply_adds_per_element(p)));
    const bool every = count <= budget;
    v.checked = every ? count : budget;
    uint64_t state = 12345;
    for (long long j = 0; j < v.checked; ++j) {
        const long long i = every || j == 0 ? j : j == 1 ? count - 1 : (long long)(next_random(state) % count);
        const double expected = reference_element(p, in.a.values.data(), in.b.values.data(), i);
        const double error = std::fabs(double(out[i]) - expected);
        v.max_reference = std::max(v.max_reference, std::fabs(expected));
        if (error > v.max_error) v.max_error = error, v.worst = i;
    }
    v.passed = v.unwritten == 0 && v.max_error <= p.tolerance * std::max(v.max_reference, 1e-30);
    return v;
}

static void print_verdict(const Problem& p, const Verdict& v) {
    printf("check: %s: %lld of %lld elements compared with the float64 reference, %lld not written (NaN or inf; "
           "the first: element %lld); max error %.3e of the largest value %.3e (element %lld), tolerance %.1e\n",
           v.passed ? "PASSED" : "FAILED", v.checked, output_count(p), v.unwritten, v.first_unwritten,
           v.max_error / std::max(v.max_reference, 1e-30), v.max_reference, v.worst, p.tolerance);
}

#ifdef STANDALONE_HOST_ONLY

static std::vector<unsigned char> read_file(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot read %s\n", path); exit(2); }
    std::vector<unsigned char> bytes;
    unsigned char block[1 << 16];
    size_t got;
    while ((got = fread(block, 1, sizeof block, f)) > 0) bytes.insert(bytes.end(), block, block + got);
    fclose(f);
    return bytes;
}

static void write_file(const std::string& path, const void* data, size_t bytes) {
    FILE* f = fopen(path.c_str(), "wb");
    if (!f || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) { fprintf(stderr, "cannot write %s\n", path.c_str()); exit(2); }
}

int main(int argc, char** argv) {
    const std::string mode = argc == 3 ? argv[1] : "";
    if (mode != "write" && mode != "check") {
        fprintf(stderr, "usage: %s write DIR | check FILE\n", argv[0]);
        return 2;
    }
    const Inputs in = make_inputs(1);
    if (mode == "write") {
        const std::string dir = argv[2];
        write_file(dir + "/a.bin", in.a.bytes.data(), in.a.bytes.size());
        write_file(dir + "/b.bin", in.b.bytes.data(), in.b.bytes.size());
        std::vector<double> reference(output_count(PROBLEM));
        for (long long i = 0; i < (long long)reference.size(); ++i)
            reference[i] = reference_element(PROBLEM, in.a.values.data(), in.b.values.data(), i);
        write_file(dir + "/reference.bin", reference.data(), reference.size() * sizeof(double));
        return 0;
    }
    const Buffer& output = buffer_of(OUTPUT);
    std::vector<unsigned char> bytes = read_file(argv[2]);
    if ((long long)bytes.size() != output.count * (long long)element_bytes(output.element)) {
        fprintf(stderr, "%s: %zu bytes, not the output's %lld\n", argv[2], bytes.size(),
                output.count * (long long)element_bytes(output.element));
        return 2;
    }
    const Verdict v = check(PROBLEM, in, decode(output, std::move(bytes)).values);
    print_verdict(PROBLEM, v);
    return v.passed ? 0 : 1;
}

#else  // the GPU program

#define CUDA_CHECK(call) cuda_check((call), #call, __LINE__)
static void cuda_check(cudaError_t error, const char* what, int line) {
    if (error != cudaSuccess) {
        fprintf(stderr, "line %d: %s: %s\n", line, what, cudaGetErrorString(error));
        exit(2);
    }
}
static void check_launch(const char* kernel) {
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) {
        fprintf(stderr, "launch of %s: %s\n", kernel, cudaGetErrorString(error));
        exit(2);
    }
}

void prepare_kernels();
void run_plan(void* const* buffers);

static double flop(const Problem& p) {  // of the convolution, whichever pass
    return 2.0 * p.N * p.P * p.Q * p.K * p.R * p.S * p.C;
}

// The median and the fastest of `repeats` runs of the plan, each timed alone by a pair of CUDA
// events after a flush of the L2 cache (a memset of twice its size), as minidl.bench kernels times.
static void time_plan(void* const* buffers, int repeats, const cudaDeviceProp& device) {
    void* flush = nullptr;
    const size_t flush_bytes = 2 * size_t(std::max(device.l2CacheSize, 1 << 20));
    CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    run_plan(buffers);  // warm-up
    std::vector<float> ms(repeats);
    for (int i = 0; i < repeats; ++i) {
        CUDA_CHECK(cudaMemsetAsync(flush, i & 0xFF, flush_bytes));
        CUDA_CHECK(cudaEventRecord(start));
        run_plan(buffers);
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[repeats / 2];
    printf("time: median %.4f ms, fastest %.4f ms of %d runs (L2 flushed before each): %.1f TFLOP/s\n", median, ms[0],
           repeats, flop(PROBLEM) / median / 1e9);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    CUDA_CHECK(cudaFree(flush));
}

int main(int argc, char** argv) {
    const int repeats = argc > 1 ? atoi(argv[1]) : 20;
    const uint64_t seed = argc > 2 ? strtoull(argv[2], nullptr, 10) : 1;
    if (argc > 3 || repeats < 0) {
        fprintf(stderr, "usage: %s [REPEATS (0: check only) [SEED]]\n", argv[0]);
        return 2;
    }
    int device_id = 0;
    cudaDeviceProp device;
    CUDA_CHECK(cudaGetDevice(&device_id));
    CUDA_CHECK(cudaGetDeviceProperties(&device, device_id));
    printf("%s\ndevice: %s, compute capability %d.%d, %d multiprocessors\n", PROBLEM.label, device.name, device.major,
           device.minor, device.multiProcessorCount);

    const Inputs in = make_inputs(seed);
    std::vector<void*> buffers(BUFFER_COUNT);
    for (int i = 0; i < BUFFER_COUNT; ++i) {  // each its own allocation, of its exact size (memcheck)
        const Buffer& b = BUFFERS[i];
        const size_t bytes = b.count * element_bytes(b.element);
        CUDA_CHECK(cudaMalloc(&buffers[i], bytes));
        if (b.role == OPERAND_A || b.role == OPERAND_B)
            CUDA_CHECK(cudaMemcpy(buffers[i], (b.role == OPERAND_A ? in.a : in.b).bytes.data(), bytes,
                                  cudaMemcpyHostToDevice));
        else
            CUDA_CHECK(cudaMemset(buffers[i], 0xFF, bytes));  // NaN in fp32 and bf16: what stays NaN was not written
    }
    prepare_kernels();
    run_plan(buffers.data());
    CUDA_CHECK(cudaDeviceSynchronize());

    int output = 0;
    while (BUFFERS[output].role != OUTPUT) ++output;
    std::vector<unsigned char> bytes(BUFFERS[output].count * element_bytes(BUFFERS[output].element));
    CUDA_CHECK(cudaMemcpy(bytes.data(), buffers[output], bytes.size(), cudaMemcpyDeviceToHost));
    const Verdict v = check(PROBLEM, in, decode(BUFFERS[output], std::move(bytes)).values);
    print_verdict(PROBLEM, v);
    if (repeats > 0) time_plan(buffers.data(), repeats, device);
    for (void* b : buffers) CUDA_CHECK(cudaFree(b));
    return v.passed ? 0 : 1;
}

#endif
// ---- end of minidl/bench/standalone_conv.cu ----
