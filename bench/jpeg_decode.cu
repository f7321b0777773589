/* bench/jpeg_decode.cu — JPEG decode alone: images/s of each nvJPEG backend
 * through streamfeed's decoder (gpu/cuda/jpeg_decode.h), the same call the
 * transform stream makes, on the *.jpg files of a folder (searched
 * recursively: a streamfeed-load cache folder works as it is).
 *
 * Per backend (hardware, gpu_hybrid, hybrid, auto) and batch size, the files
 * are cycled into batches, --warmup batches are decoded, then the wall time of
 * --iters batches up to a stream synchronisation after the last one (host work
 * such as the hybrid backends' CPU Huffman decode included) gives images/s.
 * The files sit in pinned memory, as in a ring slot. A backend the device lacks
 * is reported as unavailable.
 *
 * With --busy-ms X each backend is measured a second time with a kernel of
 * X ms that fills every SM, started on another (non-blocking) stream just
 * before every decode call, as a training step runs beside the decode in
 * the service: the host time of the call then says whether nvJPEG's call
 * needs the SMs (about X + the decode) or only its engines and the host.
 * (A one-thread kernel cannot tell: it leaves the SMs free.) With
 * --green-sms K the decode stream is in a green context of K SMs of its own
 * and the busy kernel in one of the other SMs: whether an SM split between
 * the step and the decode gives the call its time alone back.
 *
 * --lanes L decodes a batch of at least 64 files per lane in L slices at once
 * (jpeg_decode.h's lanes).
 *
 * Run: build/bench/jpeg_decode DIR [--batch 32,256] [--iters 50] [--warmup 5] [--label NAME] [--busy-ms X]
 *      [--lanes L] [--green-sms K]
 * Prints one human line and one JSON line per measurement; exits 0 with
 * "SKIPPED: no CUDA device" without a GPU.
 */
#include <cuda.h>
extern "C" {
#include "gpu/backend.h"
#include "gpu/cuda/jpeg_decode.h"
}
#include "gpu/cuda/check.h"
#include "gpu/cuda/program.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <turbojpeg.h>

#include <string>
#include <vector>

typedef struct file {
    std::vector<uint8_t> bytes;
    int h, w;
} file;

static void scan(const std::string &dir, std::vector<std::string> &out)
{
    DIR *d = opendir(dir.c_str());
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        std::string p = dir + "/" + e->d_name;
        struct stat st;
        if (stat(p.c_str(), &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode))
            scan(p, out);
        else if (p.size() > 4 && (p.compare(p.size() - 4, 4, ".jpg") == 0 || p.compare(p.size() - 4, 4, ".JPG") == 0))
            out.push_back(p);
    }
    closedir(d);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Spins each thread for ns nanoseconds of the device's global timer;
 * launched with as many blocks as every SM holds at once, so that for those
 * ns nothing else gets an SM, as beside a training step's kernels. */
__global__ void k_busy(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

/* --green-sms K: the decode stream in a green context of K SMs of its own
 * and the busy kernel's stream in one of the others (the driver's calls,
 * found through the runtime, so that nothing links libcuda). *blocks becomes
 * the busy kernel's blocks for the SMs it has. 0, or -1 with a message. */
static int green_streams(unsigned k, int per_sm, cudaStream_t *dec, cudaStream_t *busy, int *blocks)
{
    typedef CUresult (*get_t)(CUdevice, CUdevResource *, CUdevResourceType);
    typedef CUresult (*split_t)(CUdevResource *, unsigned int *, const CUdevResource *, CUdevResource *, unsigned int,
                                unsigned int);
    typedef CUresult (*desc_t)(CUdevResourceDesc *, CUdevResource *, unsigned int);
    typedef CUresult (*ctx_t)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned int);
    typedef CUresult (*stream_t)(CUstream *, CUgreenCtx, unsigned int, int);
    const char *names[5] = {"cuDeviceGetDevResource", "cuDevSmResourceSplitByCount", "cuDevResourceGenerateDesc",
                            "cuGreenCtxCreate", "cuGreenCtxStreamCreate"};
    void *f[5] = {0};
    for (int i = 0; i < 5; i++) {
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion(names[i], &f[i], 13000, cudaEnableDefault, &q) != cudaSuccess || !f[i]) {
            fprintf(stderr, "jpeg_decode: --green-sms: the driver has no %s\n", names[i]);
            return -1;
        }
    }
    CUdevResource sm, grp[1], rest;
    unsigned ng = 1;
    CUdevResourceDesc d1, d2;
    CUgreenCtx g1, g2;
    CUstream s1, s2;
    if (((get_t)f[0])(0, &sm, CU_DEV_RESOURCE_TYPE_SM) || ((split_t)f[1])(grp, &ng, &sm, &rest, 0, k) || ng != 1 ||
        ((desc_t)f[2])(&d1, grp, 1) || ((desc_t)f[2])(&d2, &rest, 1) ||
        ((ctx_t)f[3])(&g1, d1, 0, CU_GREEN_CTX_DEFAULT_STREAM) || ((ctx_t)f[3])(&g2, d2, 0, CU_GREEN_CTX_DEFAULT_STREAM) ||
        ((stream_t)f[4])(&s1, g1, CU_STREAM_NON_BLOCKING, 0) || ((stream_t)f[4])(&s2, g2, CU_STREAM_NON_BLOCKING, 0)) {
        fprintf(stderr, "jpeg_decode: --green-sms %u: the SMs could not be split into green contexts\n", k);
        return -1;
    }
    printf("green contexts: the decode on %u SMs, the busy kernel on %u\n", grp[0].sm.smCount, rest.sm.smCount);
    *dec = (cudaStream_t)s1;
    *busy = (cudaStream_t)s2;
    *blocks = (int)rest.sm.smCount * (per_sm > 0 ? per_sm : 1);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: jpeg_decode DIR [--batch 32,256] [--iters 50] [--warmup 5] [--label NAME]\n");
        return 2;
    }
    const char *dir = argv[1], *label = "jpeg";
    double busy_ms = 0;
    int lanes = 1, green_sms = 0;
    std::vector<int> batches = {32, 256};
    int iters = 50, warmup = 5;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) {
            batches.clear();
            for (char *t = strtok(argv[i + 1], ","); t; t = strtok(NULL, ","))
                batches.push_back(atoi(t));
        } else if (!strcmp(argv[i], "--iters")) {
            iters = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--warmup")) {
            warmup = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--lanes")) {
            lanes = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--green-sms")) {
            green_sms = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--busy-ms")) {
            busy_ms = atof(argv[i + 1]);
        } else if (!strcmp(argv[i], "--label")) {
            label = argv[i + 1];
        }
    }
    if (skip_without_device())
        return 0;
    std::vector<std::string> paths;
    scan(dir, paths);
    if (paths.empty()) {
        fprintf(stderr, "jpeg_decode: no *.jpg file under %s\n", dir);
        return 2;
    }
    std::vector<file> files;
    tjhandle tj = tjInitDecompress();
    size_t total_bytes = 0;
    for (const std::string &p : paths) {
        FILE *f = fopen(p.c_str(), "rb");
        if (!f)
            continue;
        file x;
        fseek(f, 0, SEEK_END);
        x.bytes.resize((size_t)ftell(f));
        fseek(f, 0, SEEK_SET);
        size_t got = fread(x.bytes.data(), 1, x.bytes.size(), f);
        fclose(f);
        int ss, cs;
        if (got != x.bytes.size() ||
            tjDecompressHeader3(tj, x.bytes.data(), (unsigned long)x.bytes.size(), &x.w, &x.h, &ss, &cs) != 0)
            continue;
        total_bytes += x.bytes.size();
        files.push_back(std::move(x));
    }
    tjDestroy(tj);
    if (files.empty()) {
        fprintf(stderr, "jpeg_decode: no readable JPEG file under %s\n", dir);
        return 2;
    }
    int maxb = 0;
    for (int b : batches)
        maxb = b > maxb ? b : maxb;
    int64_t max_px = 0;
    for (const file &f : files)
        max_px = (int64_t)f.h * f.w > max_px ? (int64_t)f.h * f.w : max_px;
    char err[300];
    sf_cuda_jpeg *j = sf_cuda_jpeg_new(maxb, max_px * maxb, 1, lanes, err, sizeof err);
    if (!j) {
        fprintf(stderr, "jpeg_decode: %s\n", err);
        return 1;
    }
    char desc[1024];
    sf_cuda_jpeg_describe(j, desc, sizeof desc);
    printf("%s: %zu files, %.1f KB average, from %s\n%s", label, files.size(), total_bytes / 1024.0 / files.size(),
           dir, desc);
    int sms = 0, per_sm = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_busy, 256, 0);
    int busy_blocks = sms * (per_sm > 0 ? per_sm : 1);
    cudaStream_t s, hog;
    cudaStreamCreate(&s);
    cudaStreamCreateWithFlags(&hog, cudaStreamNonBlocking);
    if (green_sms > 0 && green_streams((unsigned)green_sms, per_sm, &s, &hog, &busy_blocks) != 0)
        return 1;
    const sf_cuda_jpeg_backend bes[] = {SF_CUDA_JPEG_HARDWARE, SF_CUDA_JPEG_GPU_HYBRID, SF_CUDA_JPEG_HYBRID,
                                        SF_CUDA_JPEG_AUTO};
    for (int bsz : batches) {
        /* One pinned area per batch of the cycle: ceil(files / bsz) batches. */
        const int nb = ((int)files.size() + bsz - 1) / bsz;
        std::vector<uint8_t *> pin(nb);
        std::vector<std::vector<int64_t>> off(nb);
        std::vector<std::vector<sf_aug_sample>> smp(nb);
        std::vector<sf_batch> bt(nb);
        size_t bytes_per_batch = 0;
        for (int k = 0; k < nb; k++) {
            size_t len = 0, dec = 0;
            off[k].assign(1, 0);
            smp[k].assign(bsz, sf_aug_sample());
            for (int i = 0; i < bsz; i++) {
                const file &f = files[((size_t)k * bsz + i) % files.size()];
                len += f.bytes.size();
                off[k].push_back((int64_t)len);
                memset(&smp[k][i], 0, sizeof smp[k][i]);
                smp[k][i].src_h = f.h;
                smp[k][i].src_w = f.w;
                smp[k][i].src_off = dec;
                dec += (size_t)f.h * f.w * 3;
            }
            cudaMallocHost((void **)&pin[k], len);
            for (int i = 0; i < bsz; i++) {
                const file &f = files[((size_t)k * bsz + i) % files.size()];
                memcpy(pin[k] + off[k][i], f.bytes.data(), f.bytes.size());
            }
            memset(&bt[k], 0, sizeof bt[k]);
            bt[k].n = bsz;
            bt[k].c = 3;
            bt[k].nhwc = 1;
            bt[k].jpeg = pin[k];
            bt[k].jpeg_off = off[k].data();
            bt[k].samples = smp[k].data();
            bt[k].decoded_bytes = dec;
            bytes_per_batch += len;
        }
        bytes_per_batch /= (size_t)nb;
        for (sf_cuda_jpeg_backend be : bes) {
            const char *name = sf_cuda_jpeg_backend_name(be);
            if (be != SF_CUDA_JPEG_AUTO && !sf_cuda_jpeg_has(j, be)) {
                printf("%s nvjpeg %s batch %d: unavailable on this device\n", label, name, bsz);
                printf("{\"bench\":\"jpeg_decode\",\"label\":\"%s\",\"decoder\":\"nvjpeg_%s\",\"batch\":%d,"
                       "\"available\":false}\n",
                       label, name, bsz);
                continue;
            }
            sf_cuda_clear_error();
            int rc = 0;
            double t0 = 0;
            for (int it = 0; it < warmup + iters && rc == 0; it++) {
                if (it == warmup) {
                    rc = cudaStreamSynchronize(s) != cudaSuccess;
                    t0 = now_s();
                }
                rc = rc || sf_cuda_jpeg_decode(j, &bt[it % nb], be, 0, NULL, s);
            }
            rc = rc || cudaStreamSynchronize(s) != cudaSuccess;
            const double sec = now_s() - t0;
            if (rc) {
                printf("%s nvjpeg %s batch %d: failed: %s\n", label, name, bsz, sf_cuda_last_error());
                cudaGetLastError();
                continue;
            }
            const double ips = (double)iters * bsz / sec;
            const char *ran = sf_cuda_jpeg_backend_name(sf_cuda_jpeg_last(j));
            printf("%s nvjpeg %s batch %d: %.0f images/s (%.2f ms a batch; ran on %s; %.1f KB a file)\n", label,
                   name, bsz, ips, sec / iters * 1e3, ran, bytes_per_batch / 1024.0 / bsz);
            printf("{\"bench\":\"jpeg_decode\",\"label\":\"%s\",\"decoder\":\"nvjpeg_%s\",\"ran_on\":\"%s\","
                   "\"batch\":%d,\"images_per_s\":%.1f,\"ms_per_batch\":%.4f,\"iters\":%d,\"files\":%zu,"
                   "\"bytes_per_file\":%.0f}\n",
                   label, name, ran, bsz, ips, sec / iters * 1e3, iters, files.size(),
                   (double)bytes_per_batch / bsz);
            fflush(stdout);
            if (busy_ms > 0) {
                double host = 0;
                for (int it = 0; it < iters && rc == 0; it++) {
                    rc = cudaStreamSynchronize(s) != cudaSuccess || cudaStreamSynchronize(hog) != cudaSuccess;
                    k_busy<<<busy_blocks, 256, 0, hog>>>((unsigned long long)(busy_ms * 1e6));
                    const double h0 = now_s();
                    rc = rc || sf_cuda_jpeg_decode(j, &bt[it % nb], be, 0, NULL, s);
                    host += now_s() - h0;
                }
                rc = rc || cudaStreamSynchronize(s) != cudaSuccess || cudaStreamSynchronize(hog) != cudaSuccess;
                if (rc) {
                    printf("%s nvjpeg %s batch %d beside a busy stream: failed: %s\n", label, name, bsz,
                           sf_cuda_last_error());
                    cudaGetLastError();
                    continue;
                }
                printf("%s nvjpeg %s batch %d: the call holds the host %.2f ms with a %.1f ms kernel running on "
                       "another stream (%.2f ms a batch alone)\n",
                       label, name, bsz, host / iters * 1e3, busy_ms, sec / iters * 1e3);
                printf("{\"bench\":\"jpeg_decode_beside_busy\",\"label\":\"%s\",\"decoder\":\"nvjpeg_%s\","
                       "\"batch\":%d,\"busy_ms\":%.2f,\"host_ms_per_call\":%.4f,\"alone_ms_per_batch\":%.4f}\n",
                       label, name, bsz, busy_ms, host / iters * 1e3, sec / iters * 1e3);
                fflush(stdout);
            }
        }
        for (int k = 0; k < nb; k++)
            cudaFreeHost(pin[k]);
    }
    cudaStreamDestroy(s);
    cudaStreamDestroy(hog);
    sf_cuda_jpeg_free(j);
    return 0;
}
