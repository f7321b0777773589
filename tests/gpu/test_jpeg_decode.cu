/* tests/gpu/test_jpeg_decode.cu — nvJPEG (gpu/cuda/jpeg_decode.h) against
 * libjpeg-turbo (gpu/ref/jpeg.c, the oracle) on the same files.
 *
 * Files: smooth content with edges and noise, encoded by libjpeg-turbo at
 * quality 90, at several sizes (odd ones included) and subsamplings (4:4:4,
 * 4:2:2, 4:2:0, grayscale), baseline, plus progressive files for the backends
 * that take them. Each available nvJPEG backend decodes them as one ragged
 * batch into the staging area; every pixel is compared with libjpeg-turbo's.
 *
 * Tolerance. The two decoders read the same DCT coefficients and differ in
 * the IDCT's rounding (libjpeg-turbo's accurate integer IDCT is within 1 of
 * the exact transform per sample), in the chroma upsampling filter (both
 * interpolate; the edges of a subsampled plane may round differently) and in
 * the YCbCr->RGB rounding, which scales a chroma difference by up to 1.77.
 * Bound: max |nvJPEG - libjpeg-turbo| <= 8 of 255 at any pixel and mean <= 1.0
 * per file. The measured max and mean of every file are printed, for the
 * record (bench/results).
 *
 * Also: a file nvJPEG refuses is left out with skip_undecodable (the others
 * decode), a CMYK file is decoded on the host as the reference decodes it,
 * and so are PNG and WebP files and a JPEG turned by its EXIF orientation,
 * in one batch with a file nvJPEG decodes.
 * AUTO runs a baseline batch on the hardware engines where the device
 * has them and a batch with a progressive file on gpu_hybrid; grayscale gives
 * three equal channels; damaged scan data fails the batch naming the sample.
 * Through the backends (sf_backend_i): a ragged JPEG
 * batch's transform() on CUDA equals the reference backend's within the same
 * bound (a resize is a convex combination of decoded pixels), and one trains
 * through submit/poll with SLOT_FREE then STEP_DONE, its loss near the
 * reference's; with skip_undecodable an unreadable file is left out on both
 * and the batch trains its other samples.
 * The backend makes its decoder on the first encoded batch: built with
 * encoded batches on it holds no more than built with them off, a raw batch
 * makes none, a decoder the maker refuses fails that batch alone (counted)
 * and the next encoded batch makes it and trains to the loss of a backend
 * whose decoder was made before.
 *
 * Usage: test_jpeg_decode [-l] [-s SECTION[,SECTION...]]... (gpu_test.h,
 * test_sections): -l lists the sections, -s runs only those; no argument runs
 * them all. The sections, in order: rules and synthetic (no device needed:
 * they run before the SKIPPED line), decode (each nvJPEG backend against
 * libjpeg-turbo), auto, damaged, staging, sized_once, lanes,
 * through_backends, overlapped, undecodable (left out; CMYK on the host),
 * host_formats (PNG, WebP, EXIF-turned JPEG), first_encoded (the decoder
 * made by the first encoded batch). decode, auto, damaged and staging share
 * one decoder, made by the first of them that runs; staging alone refuses
 * a fresh baseline batch.
 */
#include "tests/gpu/gpu_test.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <spng.h>
#include <turbojpeg.h>
#include <webp/encode.h>

extern "C" {
#include "gpu/aug.h"
#include "gpu/backend.h"
#include "gpu/cuda/jpeg_decode.h"
#include "gpu/model.h"
#include "gpu/ref/ref.h"
}
#include "gpu/cuda/check.h"

#define MAX_ERR 8
#define MAX_MEAN 1.0

typedef struct jcase {
    int h, w, tjsamp, progressive;
    const char *name;
} jcase;

static std::vector<uint8_t> encode(const jcase &c, uint64_t seed)
{
    const int gray = c.tjsamp == TJSAMP_GRAY, ch = gray ? 1 : 3;
    std::vector<uint8_t> px((size_t)c.h * c.w * ch);
    uint64_t s = seed;
    for (int y = 0; y < c.h; y++)
        for (int x = 0; x < c.w; x++)
            for (int k = 0; k < ch; k++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                int v = (x * 200 / c.w + y * 120 / c.h + k * 50) % 256;
                if ((x / 16 + y / 16) % 3 == 0)
                    v = 255 - v; /* edges, where the decoders' rounding shows */
                v += (int)((s >> 59) & 15) - 8;
                px[((size_t)y * c.w + x) * ch + k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    tjhandle tj = tjInitCompress();
    unsigned char *out = NULL;
    unsigned long len = 0;
    if (tjCompress2(tj, px.data(), c.w, c.w * ch, c.h, gray ? TJPF_GRAY : TJPF_RGB, &out, &len, c.tjsamp, 90,
                    c.progressive ? TJFLAG_PROGRESSIVE : 0) != 0) {
        fail("encode %s: %s", c.name, tjGetErrorStr2(tj));
        tjDestroy(tj);
        return {};
    }
    std::vector<uint8_t> f(out, out + len);
    tjFree(out);
    tjDestroy(tj);
    return f;
}

/* An encoded batch of the cases' files, and the samples' decode layout. */
typedef struct jbatch {
    std::vector<uint8_t> bytes;
    std::vector<int64_t> off;
    std::vector<sf_aug_sample> smp;
    size_t decoded;
    unsigned forms;
    sf_batch b;
} jbatch;

static void make_batch(jbatch &jb, const std::vector<jcase> &cases, uint64_t seed)
{
    jb.bytes.clear();
    jb.off.assign(1, 0);
    jb.smp.assign(cases.size(), sf_aug_sample());
    jb.decoded = 0;
    jb.forms = 0;
    for (size_t i = 0; i < cases.size(); i++) {
        std::vector<uint8_t> f = encode(cases[i], seed + i);
        jb.bytes.insert(jb.bytes.end(), f.begin(), f.end());
        jb.off.push_back((int64_t)jb.bytes.size());
        memset(&jb.smp[i], 0, sizeof jb.smp[i]);
        jb.smp[i].src_h = cases[i].h;
        jb.smp[i].src_w = cases[i].w;
        jb.smp[i].src_off = jb.decoded;
        jb.decoded += (size_t)cases[i].h * cases[i].w * 3;
        /* What the server's header read would report (server/upload.c). */
        if (cases[i].progressive)
            jb.forms |= SF_JPEG_FORM_PROGRESSIVE;
    }
    memset(&jb.b, 0, sizeof jb.b);
    jb.b.n = (int)cases.size();
    jb.b.c = 3;
    jb.b.nhwc = 1;
    jb.b.jpeg = jb.bytes.data();
    jb.b.jpeg_off = jb.off.data();
    jb.b.jpeg_forms = jb.forms;
    jb.b.decoded_bytes = jb.decoded;
    jb.b.samples = jb.smp.data();
}

static void compare(const char *be, const std::vector<jcase> &cases, const jbatch &jb, const uint8_t *got,
                    const uint8_t *ref)
{
    for (size_t i = 0; i < cases.size(); i++) {
        const size_t o = jb.smp[i].src_off, len = (size_t)cases[i].h * cases[i].w * 3;
        int worst = 0;
        size_t at = 0;
        double sum = 0;
        for (size_t k = 0; k < len; k++) {
            int d = abs((int)got[o + k] - (int)ref[o + k]);
            sum += d;
            if (d > worst) {
                worst = d;
                at = k;
            }
        }
        const double mean = sum / (double)len;
        if (worst <= MAX_ERR && mean <= MAX_MEAN)
            ok("%s %s %dx%d: max |nvJPEG - libjpeg-turbo| %d, mean %.3f (bound %d, %.1f)", be, cases[i].name,
               cases[i].h, cases[i].w, worst, mean, MAX_ERR, MAX_MEAN);
        else
            fail("%s %s %dx%d: max |nvJPEG - libjpeg-turbo| %d at (y %zu, x %zu, c %zu): %d vs %d, mean %.3f "
                 "(bound %d, %.1f)",
                 be, cases[i].name, cases[i].h, cases[i].w, worst, at / 3 / cases[i].w, at / 3 % cases[i].w,
                 at % 3, got[o + at], ref[o + at], mean, MAX_ERR, MAX_MEAN);
        if (cases[i].tjsamp == TJSAMP_GRAY) {
            size_t unequal = 0;
            for (size_t p = 0; p < len; p += 3)
                unequal += got[o + p] != got[o + p + 1] || got[o + p] != got[o + p + 2];
            if (unequal)
                fail("%s %s: %zu grayscale pixels decoded to unequal channels", be, cases[i].name, unequal);
        }
    }
}

/* A ragged JPEG batch through both backends' vtables (the tiny model, 32x32x3
 * in, behind a resize). */
static void through_backends(const std::vector<jcase> &cases)
{
    char err[300];
    sf_backend *cu = sf_backend_cuda_new(0, err, sizeof err), *ref = sf_backend_ref_new(err, sizeof err);
    sf_model m;
    sf_aug_pipeline pipe;
    sf_aug_plan plan;
    if (!cu || !ref || sf_model_from_preset("tiny", &m, err, sizeof err) ||
        sf_aug_parse("[{\"op\":\"resize\",\"size\":[32,32]}]", &pipe, err, sizeof err) ||
        sf_aug_plan_make_ragged(&pipe, 3, &plan, err, sizeof err)) {
        fail("backends: setup: %s", err);
        return;
    }
    sf_train_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.seed = 42;
    cfg.max_batch = (int)cases.size();
    cfg.overlap = 1;
    cfg.cuda_graphs = 1;
    cfg.jpeg_max_batch_pixels = 4 << 20;
    if (cu->i->build(cu, &m, &cfg, err, sizeof err) || ref->i->build(ref, &m, &cfg, err, sizeof err)) {
        fail("backends: build: %s", err);
        return;
    }
    jbatch jb;
    make_batch(jb, cases, 99);
    const int n = (int)cases.size();
    std::vector<int> hw(2 * (size_t)n);
    for (int i = 0; i < n; i++) {
        hw[2 * i] = cases[i].h;
        hw[2 * i + 1] = cases[i].w;
    }
    std::vector<sf_aug_sample> smp(n);
    sf_aug_gen_ragged(&pipe, &plan, 1, 1, n, hw.data(), smp.data());
    /* The files in pinned memory, as in a ring slot. */
    uint8_t *files = (uint8_t *)cu->i->host_alloc(cu, jb.bytes.size());
    memcpy(files, jb.bytes.data(), jb.bytes.size());
    std::vector<int64_t> labels(n);
    for (int i = 0; i < n; i++)
        labels[i] = i % 10;
    sf_batch b = jb.b;
    b.jpeg = files;
    b.samples = smp.data();
    b.plan = &plan;
    b.labels = labels.data();
    b.label_dtype = SF_LABEL_I64;
    b.hyper.lr = 0.01f;
    b.id = b.seq = 1;
    const size_t len = (size_t)n * 3 * 32 * 32;
    std::vector<float> oc(len, NAN), orf(len, NAN);
    if (cu->i->transform(cu, &b, oc.data(), err, sizeof err) ||
        ref->i->transform(ref, &b, orf.data(), err, sizeof err)) {
        fail("backends: transform: %s", err);
    } else {
        double worst = 0;
        for (size_t k = 0; k < len; k++)
            worst = isfinite(oc[k]) ? fmax(worst, fabs((double)oc[k] - orf[k])) : INFINITY;
        if (worst <= MAX_ERR)
            ok("transform() of a ragged JPEG batch (%d files): CUDA vs reference max |diff| %.3f of 255", n, worst);
        else
            fail("transform() of a ragged JPEG batch: CUDA vs reference max |diff| %.3f of 255 (bound %d)", worst,
                 MAX_ERR);
    }
    float loss[2] = {NAN, NAN};
    sf_backend *bes[2] = {cu, ref};
    for (int k = 0; k < 2; k++) {
        if (bes[k]->i->submit(bes[k], &b, err, sizeof err)) {
            fail("%s submit of a JPEG batch: %s", bes[k]->i->name(bes[k]), err);
            continue;
        }
        sf_event ev[4];
        int got = 0, slot_first = 0, status = -2;
        for (int tries = 0; tries < 1000 && got < 2; tries++) {
            int e = bes[k]->i->poll(bes[k], ev, 4, 10000);
            for (int i = 0; i < e; i++, got++) {
                if (ev[i].kind == SF_EV_SLOT_FREE)
                    slot_first = got == 0;
                else {
                    status = ev[i].status;
                    loss[k] = ev[i].loss;
                    /* The engine counts JPEG batches per decoder from this. */
                    if (status == 0 && (!ev[i].decoder[0] || (k == 1 && strcmp(ev[i].decoder, "libjpeg-turbo"))))
                        fail("%s: STEP_DONE of a JPEG batch names decoder \"%s\"", bes[k]->i->name(bes[k]),
                             ev[i].decoder);
                    else if (status == 0)
                        ok("%s: STEP_DONE of a JPEG batch names its decoder (%s, %.3f ms on the host)",
                           bes[k]->i->name(bes[k]), ev[i].decoder, ev[i].decode_host_s * 1e3);
                    if (status)
                        printf("  %s: %s\n", bes[k]->i->name(bes[k]), ev[i].err);
                }
            }
        }
        if (got != 2 || !slot_first || status != 0)
            fail("%s: a JPEG batch gave %d events (SLOT_FREE first %d, status %d)", bes[k]->i->name(bes[k]), got,
                 slot_first, status);
    }
    if (isfinite(loss[0]) && fabs(loss[0] - loss[1]) <= 0.02 * fabs(loss[1]))
        ok("a JPEG batch trains through submit/poll: loss %.5f on CUDA, %.5f on the reference", loss[0], loss[1]);
    else
        fail("JPEG batch loss %.5f on CUDA vs %.5f on the reference (2%% allowed)", loss[0], loss[1]);
    /* A file the decoder cannot read (its markers zeroed after SOI) fails
     * the submission itself on both backends, before anything is queued
     * and with no event: in a data-parallel round the engine then joins the
     * step with an empty contribution. The backend goes on: the same batch
     * with the good file trains. */
    {
        uint8_t *badf = (uint8_t *)cu->i->host_alloc(cu, jb.bytes.size());
        memcpy(badf, jb.bytes.data(), jb.bytes.size());
        memset(badf + jb.off[0] + 2, 0, (size_t)(jb.off[1] - jb.off[0] - 2));
        sf_batch bad = b;
        bad.jpeg = badf;
        for (int k = 0; k < 2; k++) {
            char e1[300] = "";
            const int r1 = bes[k]->i->submit(bes[k], &bad, e1, sizeof e1);
            sf_event ev[4];
            const int stray = bes[k]->i->poll(bes[k], ev, 4, 100000);
            int status = -2;
            if (bes[k]->i->submit(bes[k], &b, err, sizeof err) == 0)
                for (int tries = 0; tries < 1000 && status == -2; tries++) {
                    const int e = bes[k]->i->poll(bes[k], ev, 4, 10000);
                    for (int i = 0; i < e; i++)
                        if (ev[i].kind == SF_EV_STEP_DONE)
                            status = ev[i].status;
                }
            if (r1 == SF_BACKEND_BAD_INPUT && stray == 0 && status == 0)
                ok("%s: an unreadable file fails the submission (%s); the next batch trains", bes[k]->i->name(bes[k]),
                   e1);
            else
                fail("%s: an unreadable file: submit returned %d, %d events after it, the next batch's status %d",
                     bes[k]->i->name(bes[k]), r1, stray, status);
        }
        cu->i->host_free(cu, badf);
    }
    /* With skip_undecodable the same unreadable file is left out: both
     * backends train the other samples (STEP_DONE's n counts them, the
     * marks name sample 0) and their losses agree; a transform's row 0 is
     * zeros on both. */
    {
        uint8_t *badf = (uint8_t *)cu->i->host_alloc(cu, jb.bytes.size());
        memcpy(badf, jb.bytes.data(), jb.bytes.size());
        memset(badf + jb.off[0] + 2, 0, (size_t)(jb.off[1] - jb.off[0] - 2));
        float skip_loss[2] = {NAN, NAN};
        for (int k = 0; k < 2; k++) {
            std::vector<uint8_t> marks((size_t)n, 9);
            sf_batch bad = b;
            bad.jpeg = badf;
            bad.skip_undecodable = 1;
            bad.undecodable = marks.data();
            bad.id = bad.seq = 7;
            std::vector<float> out(len, NAN);
            if (bes[k]->i->transform(bes[k], &bad, out.data(), err, sizeof err) != 0) {
                fail("%s: transform with a file left out: %s", bes[k]->i->name(bes[k]), err);
                continue;
            }
            int zero = 1;
            for (size_t q = 0; q < len / (size_t)n; q++)
                zero &= out[q] == 0.0f;
            if (!zero || marks[0] != 1)
                fail("%s: transform with a file left out: row 0 zero %d, mark %d", bes[k]->i->name(bes[k]), zero,
                     marks[0]);
            if (bes[k]->i->submit(bes[k], &bad, err, sizeof err) != 0) {
                fail("%s: submit with a file left out: %s", bes[k]->i->name(bes[k]), err);
                continue;
            }
            sf_event ev[4];
            int done_n = -1, status = -2;
            for (int tries = 0; tries < 1000 && status == -2; tries++) {
                const int e = bes[k]->i->poll(bes[k], ev, 4, 10000);
                for (int i = 0; i < e; i++)
                    if (ev[i].kind == SF_EV_STEP_DONE) {
                        status = ev[i].status;
                        done_n = ev[i].n;
                        skip_loss[k] = ev[i].loss;
                    }
            }
            int marked = 0;
            for (int i = 0; i < n; i++)
                marked += marks[i] != 0;
            if (status == 0 && done_n == n - 1 && marks[0] == 1 && marked == 1)
                ok("%s: a file left out: the batch trains its other %d samples", bes[k]->i->name(bes[k]), done_n);
            else
                fail("%s: a file left out: status %d, n %d (want %d), %d marked", bes[k]->i->name(bes[k]), status,
                     done_n, n - 1, marked);
        }
        if (isfinite(skip_loss[0]) && fabs(skip_loss[0] - skip_loss[1]) <= 0.02 * fabs(skip_loss[1]))
            ok("a batch with a file left out: loss %.5f on CUDA, %.5f on the reference", skip_loss[0], skip_loss[1]);
        else
            fail("a batch with a file left out: loss %.5f on CUDA vs %.5f on the reference", skip_loss[0],
                 skip_loss[1]);
        cu->i->host_free(cu, badf);
    }
    static char desc[1 << 16];
    size_t dev_bytes = 0;
    if (cu->i->describe && cu->i->describe(cu, desc, sizeof desc, &dev_bytes) == 0 && strstr(desc, "jpeg decode: nvJPEG"))
        ok("describe() names the JPEG decoder");
    else
        fail("describe() does not name the JPEG decoder");
    cu->i->host_free(cu, files);
    cu->i->destroy(cu);
    ref->i->destroy(ref);
}

/* Losses of `nb` different JPEG batches trained in a row through submit/poll
 * on a fresh CUDA backend, with up to max_inflight batches queued. */
static std::vector<float> train_in_a_row(const std::vector<jcase> &cases, int overlap, int nb)
{
    char err[300];
    std::vector<float> losses;
    sf_backend *cu = sf_backend_cuda_new(0, err, sizeof err);
    sf_model m;
    sf_aug_pipeline pipe;
    sf_aug_plan plan;
    if (!cu || sf_model_from_preset("tiny", &m, err, sizeof err) ||
        sf_aug_parse("[{\"op\":\"resize\",\"size\":[32,32]}]", &pipe, err, sizeof err) ||
        sf_aug_plan_make_ragged(&pipe, 3, &plan, err, sizeof err)) {
        fail("in a row: setup: %s", err);
        return losses;
    }
    sf_train_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.seed = 42;
    cfg.max_batch = (int)cases.size();
    cfg.overlap = overlap;
    cfg.cuda_graphs = 1;
    cfg.tune_configs = 1; /* one engine choice for both builds: only the decode path differs */
    cfg.jpeg_max_batch_pixels = 4 << 20;
    if (cu->i->build(cu, &m, &cfg, err, sizeof err)) {
        fail("in a row: build: %s", err);
        cu->i->destroy(cu);
        return losses;
    }
    const int n = (int)cases.size();
    std::vector<jbatch> jbs(nb);
    std::vector<std::vector<sf_aug_sample>> smp(nb, std::vector<sf_aug_sample>(n));
    std::vector<uint8_t *> files(nb);
    std::vector<int64_t> labels(n);
    for (int i = 0; i < n; i++)
        labels[i] = i % 10;
    std::vector<int> hw(2 * (size_t)n);
    for (int i = 0; i < n; i++) {
        hw[2 * i] = cases[i].h;
        hw[2 * i + 1] = cases[i].w;
    }
    std::vector<sf_batch> bs(nb);
    for (int k = 0; k < nb; k++) {
        make_batch(jbs[k], cases, 3000 + 100 * (uint64_t)k); /* other pixels in every batch */
        sf_aug_gen_ragged(&pipe, &plan, 1, (uint64_t)k + 1, n, hw.data(), smp[k].data());
        files[k] = (uint8_t *)cu->i->host_alloc(cu, jbs[k].bytes.size());
        memcpy(files[k], jbs[k].bytes.data(), jbs[k].bytes.size());
        bs[k] = jbs[k].b;
        bs[k].jpeg = files[k];
        bs[k].samples = smp[k].data();
        bs[k].plan = &plan;
        bs[k].labels = labels.data();
        bs[k].label_dtype = SF_LABEL_I64;
        /* Evaluation batches: the same decode and augmentation as training
         * ones, but no update, so each batch's loss is a function of its
         * decoded and augmented pixels alone (training steps need not be
         * bitwise reproducible: two serial runs of training batches came
         * 1e-4 apart on the H100). A decode that overwrote pixels an
         * augmentation still read, or an augmentation of pixels not yet
         * decoded, shows as another loss. */
        bs[k].eval = 1;
        bs[k].id = bs[k].seq = (uint64_t)k + 1;
    }
    losses.assign(nb, NAN);
    int submitted = 0, done = 0, inflight = 0;
    for (int tries = 0; done < nb && tries < 20000; tries++) {
        while (submitted < nb && inflight < cu->i->max_inflight(cu)) {
            if (cu->i->submit(cu, &bs[submitted], err, sizeof err)) {
                fail("in a row: submit %d: %s", submitted, err);
                submitted = nb;
                done = nb;
                break;
            }
            submitted++;
            inflight++;
        }
        sf_event ev[8];
        const int e = cu->i->poll(cu, ev, 8, 10000);
        for (int i = 0; i < e; i++)
            if (ev[i].kind == SF_EV_STEP_DONE) {
                inflight--;
                done++;
                if (ev[i].status == 0 && ev[i].id >= 1 && ev[i].id <= (uint64_t)nb)
                    losses[ev[i].id - 1] = ev[i].loss;
                else
                    printf("  batch %llu: %s\n", (unsigned long long)ev[i].id, ev[i].err);
            }
    }
    for (int k = 0; k < nb; k++)
        cu->i->host_free(cu, files[k]);
    cu->i->destroy(cu);
    return losses;
}

/* The decode of batch N+1 runs on its own stream into the other staging area
 * while batch N is augmented: a missing wait would let a decode overwrite
 * pixels an augmentation still reads, or an augmentation read pixels not yet
 * decoded. The serial path (overlap 0: one stream, one staging area) has the
 * same hazard one batch closer, for a decoder that writes outside the
 * stream's order (the hardware engines). Evaluation batches are a function
 * of their pixels, and the forward is deterministic: batches of other pixels
 * trained in a row give bit-identical losses on both paths and on two serial
 * runs (before the host waited for the staging area, the serial runs drifted
 * 5e-5 to 2e-4 apart on the H100, run to run). */
static void overlapped_decode_equals_serial(const std::vector<jcase> &cases)
{
    const int nb = 8;
    std::vector<float> a = train_in_a_row(cases, 1, nb), b = train_in_a_row(cases, 0, nb),
                       b2 = train_in_a_row(cases, 0, nb);
    if ((int)a.size() != nb || (int)b.size() != nb || (int)b2.size() != nb)
        return;
    int bad = -1;
    for (int k = 0; k < nb && bad < 0; k++)
        if (!(isfinite(b[k]) && a[k] == b[k] && b2[k] == b[k]))
            bad = k;
    if (bad < 0)
        ok("%d JPEG batches in a row: overlapped decode and two serial runs give bit-identical losses", nb);
    else
        fail("%d JPEG batches in a row: batch %d's loss is %.9g overlapped, %.9g and %.9g serial", nb, bad,
             a[bad], b[bad], b2[bad]);
}

/* A JPEG decoder maker (sf_cuda_jpeg_maker, cfg.jpeg_maker) that refuses its
 * next `refuse` calls as a decoder whose device memory is taken is refused,
 * then makes nvJPEG's real decoder. The engine thread (here: the test's)
 * calls it. */
typedef struct refusing_maker {
    int refuse; /* calls still to refuse */
    int calls;  /* calls so far */
} refusing_maker;

#define REFUSED_MSG "cudaMalloc of the staging area: out of memory (the test's maker refuses it)"

static sf_cuda_jpeg *make_refusing(void *ctx, int max_batch, int64_t max_pixels, int stages, int lanes, char *err,
                                   size_t errlen)
{
    refusing_maker *r = (refusing_maker *)ctx;
    r->calls++;
    if (r->refuse > 0) {
        r->refuse--;
        snprintf(err, errlen, "%s", REFUSED_MSG);
        return NULL;
    }
    return sf_cuda_jpeg_new(max_batch, max_pixels, stages, lanes, err, errlen);
}

/* One CUDA backend of the made-on-first-use checks, and its batches. */
typedef struct lazy_rig {
    sf_backend *cu;
    refusing_maker rm;
    sf_cuda_jpeg_maker maker;
    uint8_t *hraw;
    std::vector<uint8_t *> files;
} lazy_rig;

/* Waits for batch id's STEP_DONE; its status, or -1 when it never came. */
static int wait_step(sf_backend *cu, uint64_t id, float *loss)
{
    for (int tries = 0; tries < 500; tries++) {
        sf_event ev[8];
        const int e = cu->i->poll(cu, ev, 8, 10000);
        for (int i = 0; i < e; i++)
            if (ev[i].kind == SF_EV_STEP_DONE && ev[i].id == id) {
                *loss = ev[i].loss;
                if (ev[i].status)
                    printf("  batch %llu: %s\n", (unsigned long long)id, ev[i].err);
                return ev[i].status;
            }
    }
    return -1;
}

/* The CUDA backend makes its JPEG decoder on the first encoded batch, so a
 * job that posts raw pixels holds none of its memory. Built for encoded
 * batches of up to 64 Mpx (192 MiB of staging per area), it holds by its own
 * count (describe) what a build with encoded batches off holds, and
 * decoder_memory says none is made; a raw batch trains and makes none. With
 * the maker refusing (as cudaMalloc does when training holds the memory: the
 * test never takes the device's memory, since GPU tests share the device),
 * the first encoded transform() and the first encoded submit() each come to
 * SF_BACKEND_NO_DECODER naming why, with nothing run, nothing kept and each
 * counted; the next encoded batch makes the decoder and trains to the loss of
 * a backend whose decoder was made before its first batch (by a transform,
 * which trains nothing). With encoded batches off the maker is never called
 * and an encoded batch is refused saying so. */
static void decoder_made_by_the_first_encoded_batch(const std::vector<jcase> &cases)
{
    char err[600];
    sf_model m;
    sf_aug_pipeline pipe, raw_pipe;
    sf_aug_plan plan, raw_plan;
    const int side = 32;
    if (sf_model_from_preset("tiny", &m, err, sizeof err) ||
        sf_aug_parse("[{\"op\":\"resize\",\"size\":[32,32]}]", &pipe, err, sizeof err) ||
        sf_aug_plan_make_ragged(&pipe, 3, &plan, err, sizeof err) || sf_aug_parse("[]", &raw_pipe, err, sizeof err) ||
        sf_aug_plan_make(&raw_pipe, side, side, 3, &raw_plan, err, sizeof err)) {
        fail("made on first use: setup: %s", err);
        return;
    }
    const int n = (int)cases.size();
    const int64_t big = (int64_t)64 << 20;
    const size_t area_bytes = (size_t)big * 3;
    sf_train_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.seed = 42;
    cfg.max_batch = n;
    cfg.overlap = 1;
    cfg.cuda_graphs = 1;
    cfg.tune_configs = 1; /* one engine choice for every build: only the decoder's making differs */

    std::vector<int64_t> labels(n);
    for (int i = 0; i < n; i++)
        labels[i] = i % 10;
    std::vector<int> hw(2 * (size_t)n);
    for (int i = 0; i < n; i++) {
        hw[2 * i] = cases[i].h;
        hw[2 * i + 1] = cases[i].w;
    }
    std::vector<sf_aug_sample> smp(n), raw_smp(n);
    sf_aug_gen_ragged(&pipe, &plan, 1, 1, n, hw.data(), smp.data());
    sf_aug_gen(&raw_pipe, &raw_plan, 1, 1, n, raw_smp.data());
    std::vector<uint8_t> raw((size_t)n * side * side * 3);
    for (size_t i = 0; i < raw.size(); i++)
        raw[i] = (uint8_t)(i * 31 + i / 97);
    std::vector<jbatch> jbs(2);
    for (int k = 0; k < 2; k++)
        make_batch(jbs[k], cases, 8000 + 100 * (uint64_t)k);
    const size_t out_len = (size_t)n * 3 * 32 * 32;
    std::vector<float> out(out_len);

    /* rigs[0]: the maker refuses; rigs[1]: its decoder made before its
     * first batch; rigs[2]: encoded batches off. */
    lazy_rig rigs[3]{};
    size_t took[3] = {0, 0, 0};
    std::vector<char> text(1 << 16);
    for (int r = 0; r < 3; r++) {
        lazy_rig &g = rigs[r];
        g.rm = {0, 0};
        g.maker = {make_refusing, &g.rm};
        cfg.jpeg_maker = &g.maker;
        cfg.jpeg_max_batch_pixels = r == 2 ? 0 : big;
        g.cu = sf_backend_cuda_new(0, err, sizeof err);
        if (!g.cu || g.cu->i->build(g.cu, &m, &cfg, err, sizeof err) ||
            g.cu->i->describe(g.cu, text.data(), text.size(), &took[r]) != 0) {
            fail("made on first use: build %d: %s", r, err);
            for (int q = 0; q <= r; q++)
                if (rigs[q].cu)
                    rigs[q].cu->i->destroy(rigs[q].cu);
            return;
        }
        g.hraw = (uint8_t *)g.cu->i->host_alloc(g.cu, raw.size());
        memcpy(g.hraw, raw.data(), raw.size());
        for (int k = 0; k < 2; k++) {
            g.files.push_back((uint8_t *)g.cu->i->host_alloc(g.cu, jbs[k].bytes.size()));
            memcpy(g.files[k], jbs[k].bytes.data(), jbs[k].bytes.size());
        }
    }
    /* Frees a rig's backend, and with it the decoder it made: two decoders
     * at these bounds are not held at once on the shared device. */
    auto drop = [&](lazy_rig &g) {
        if (!g.cu)
            return;
        for (uint8_t *f : g.files)
            g.cu->i->host_free(g.cu, f);
        g.cu->i->host_free(g.cu, g.hraw);
        g.cu->i->destroy(g.cu);
        g.cu = NULL;
    };
    auto raw_batch = [&](lazy_rig &g) {
        sf_batch rb;
        memset(&rb, 0, sizeof rb);
        rb.n = n;
        rb.h = side;
        rb.w = side;
        rb.c = 3;
        rb.nhwc = 1;
        rb.images = g.hraw;
        rb.plan = &raw_plan;
        rb.samples = raw_smp.data();
        rb.labels = labels.data();
        rb.label_dtype = SF_LABEL_I64;
        rb.hyper.lr = 0.01f;
        rb.id = rb.seq = 1;
        return rb;
    };
    auto jpeg_batch = [&](lazy_rig &g, int k) {
        sf_batch b = jbs[k].b;
        b.jpeg = g.files[k];
        b.samples = smp.data();
        b.plan = &plan;
        b.labels = labels.data();
        b.label_dtype = SF_LABEL_I64;
        b.hyper.lr = 0.01f;
        b.id = b.seq = 2 + (uint64_t)k;
        return b;
    };

    sf_backend *cu = rigs[0].cu;
    refusing_maker &rm = rigs[0].rm;
    sf_decoder_memory dm;
    memset(&dm, 0xFF, sizeof dm);
    if (!cu->i->decoder_memory || cu->i->decoder_memory(cu, &dm) != 0 || dm.made || dm.device_bytes ||
        dm.pinned_bytes || dm.not_made || took[0] != took[2] || rm.calls != 0)
        fail("made on first use: after build the decoder is made %d, holds %zu B device and %zu B pinned, %lld "
             "refusals, the maker called %d time(s); the build holds %zu B with encoded batches on, %zu B off; "
             "want none made, 0, 0, 0, no call and equal",
             dm.made, dm.device_bytes, dm.pinned_bytes, dm.not_made, rm.calls, took[0], took[2]);
    else
        ok("made on first use: built for %lld-pixel encoded batches, it holds no decoder (the build holds %zu MiB, "
           "as with encoded batches off; one staging area alone is %zu MiB)",
           (long long)big, took[0] >> 20, area_bytes >> 20);

    /* A raw batch: it trains, and still no decoder. */
    sf_batch rb = raw_batch(rigs[0]);
    float raw_loss[2] = {NAN, NAN}, loss = NAN;
    int rc = cu->i->submit(cu, &rb, err, sizeof err);
    if (rc == 0)
        rc = wait_step(cu, rb.id, &raw_loss[0]);
    cu->i->decoder_memory(cu, &dm);
    if (rc != 0 || !isfinite(raw_loss[0]) || dm.made || dm.device_bytes || rm.calls != 0)
        fail("made on first use: a raw batch gave %d (%s), loss %g; the decoder made %d, %zu B, the maker called "
             "%d time(s)", rc, err, raw_loss[0], dm.made, dm.device_bytes, rm.calls);
    else
        ok("made on first use: a raw batch trains (loss %.5f) and makes no decoder", raw_loss[0]);

    /* Refused twice: the first encoded transform(), then the first encoded
     * submit(). Each fails alone, keeps nothing and is counted. */
    rm.refuse = 2;
    sf_batch b0 = jpeg_batch(rigs[0], 0);
    char terr[600] = "";
    const int trc = cu->i->transform(cu, &b0, out.data(), terr, sizeof terr);
    cu->i->decoder_memory(cu, &dm);
    if (trc != SF_BACKEND_NO_DECODER || !strstr(terr, "could not be made") || !strstr(terr, REFUSED_MSG) ||
        dm.made || dm.device_bytes || dm.not_made != 1 || rm.calls != 1)
        fail("made on first use: with its decoder refused, an encoded transform gave %d (%s), made %d, %zu B, %lld "
             "refusal(s) counted, the maker called %d time(s); want SF_BACKEND_NO_DECODER naming why, none, 1, 1",
             trc, terr, dm.made, dm.device_bytes, dm.not_made, rm.calls);
    else
        ok("made on first use: with its decoder refused, an encoded transform fails alone, counted: %s", terr);
    const int src = cu->i->submit(cu, &b0, err, sizeof err);
    sf_event ev[8];
    const int stray = src == 0 ? 0 : cu->i->poll(cu, ev, 8, 100000);
    cu->i->decoder_memory(cu, &dm);
    if (src != SF_BACKEND_NO_DECODER || !strstr(err, "could not be made") || !strstr(err, REFUSED_MSG) || stray ||
        dm.made || dm.device_bytes || dm.not_made != 2 || rm.calls != 2)
        fail("made on first use: with its decoder refused, an encoded submit gave %d (%s), %d event(s) after it, "
             "made %d, %zu B, %lld refusal(s) counted, the maker called %d time(s); want SF_BACKEND_NO_DECODER "
             "naming why, none, none, 0 B, 2, 2",
             src, err, stray, dm.made, dm.device_bytes, dm.not_made, rm.calls);
    else
        ok("made on first use: with its decoder refused, an encoded training batch fails alone before anything "
           "runs, counted (%lld so far)", dm.not_made);

    /* The next encoded batch makes the decoder and trains. */
    sf_batch b1 = jpeg_batch(rigs[0], 1);
    struct timespec m0, m1;
    clock_gettime(CLOCK_MONOTONIC, &m0);
    rc = cu->i->submit(cu, &b1, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &m1);
    const double make_ms = (double)(m1.tv_sec - m0.tv_sec) * 1e3 + (double)(m1.tv_nsec - m0.tv_nsec) * 1e-6;
    if (rc == 0)
        rc = wait_step(cu, b1.id, &loss);
    cu->i->decoder_memory(cu, &dm);
    const float lazy_loss = loss;
    if (rc != 0 || !isfinite(loss) || !dm.made || dm.device_bytes < 2 * area_bytes || dm.not_made != 2 ||
        rm.calls != 3)
        fail("made on first use: the next encoded batch gave %d (%s), loss %g; made %d, %zu B device, %lld "
             "refusal(s), the maker called %d time(s); want 0, a finite loss, made, at least %zu B, 2, 3 calls",
             rc, err, loss, dm.made, dm.device_bytes, dm.not_made, rm.calls, 2 * area_bytes);
    else
        ok("made on first use: the next encoded batch makes the decoder (%zu MiB device, %zu MiB pinned; its "
           "submit took %.0f ms) and trains, loss %.5f", dm.device_bytes >> 20, dm.pinned_bytes >> 20, make_ms, loss);
    /* Kept: another encoded batch does not make it again. */
    rc = cu->i->submit(cu, &b0, err, sizeof err);
    if (rc == 0)
        rc = wait_step(cu, b0.id, &loss);
    if (rc != 0 || rm.calls != 3)
        fail("made on first use: a later encoded batch gave %d (%s), the maker called %d time(s) (want 3)", rc, err,
             rm.calls);
    else
        ok("made on first use: the decoder is kept; a later encoded batch trains (loss %.5f) without another", loss);
    drop(rigs[0]);

    /* The same batches on a backend whose decoder was made before the first
     * (by a transform, which trains nothing): the same losses. */
    sf_backend *cu2 = rigs[1].cu;
    sf_batch t1 = jpeg_batch(rigs[1], 0);
    rc = cu2->i->transform(cu2, &t1, out.data(), err, sizeof err);
    cu2->i->decoder_memory(cu2, &dm);
    if (rc != 0 || !dm.made || rigs[1].rm.calls != 1)
        fail("made on first use: a transform on a fresh backend gave %d (%s), made %d, the maker called %d time(s)",
             rc, err, dm.made, rigs[1].rm.calls);
    rb = raw_batch(rigs[1]);
    rc = cu2->i->submit(cu2, &rb, err, sizeof err);
    if (rc == 0)
        rc = wait_step(cu2, rb.id, &raw_loss[1]);
    sf_batch c1 = jpeg_batch(rigs[1], 1);
    float made_loss = NAN;
    if (rc == 0 && (rc = cu2->i->submit(cu2, &c1, err, sizeof err)) == 0)
        rc = wait_step(cu2, c1.id, &made_loss);
    if (rc != 0 || !isfinite(made_loss) || fabsf(raw_loss[1] - raw_loss[0]) > 1e-5f * fabsf(raw_loss[0]) ||
        fabsf(made_loss - lazy_loss) > 1e-5f * fabsf(made_loss))
        fail("made on first use: losses %.9g then %.9g with the decoder made before, %.9g then %.9g made by the "
             "batch after its refusals (status %d: %s); want equal within 1e-5",
             raw_loss[1], made_loss, raw_loss[0], lazy_loss, rc, err);
    else
        ok("made on first use: the batch after the refusals trains to the loss of a backend whose decoder was made "
           "before (%.9g and %.9g)", lazy_loss, made_loss);

    /* Encoded batches off: refused saying so, and no decoder is tried. */
    sf_backend *cu3 = rigs[2].cu;
    sf_batch d0 = jpeg_batch(rigs[2], 0);
    rc = cu3->i->submit(cu3, &d0, err, sizeof err);
    cu3->i->decoder_memory(cu3, &dm);
    if (rc != -1 || !strstr(err, "jpeg.max_batch_pixels is 0") || dm.made || dm.not_made || rigs[2].rm.calls)
        fail("made on first use: with encoded batches off, an encoded batch gave %d (%s), made %d, %lld refusal(s), "
             "the maker called %d time(s)", rc, err, dm.made, dm.not_made, rigs[2].rm.calls);
    else
        ok("made on first use: with encoded batches off, an encoded batch is refused (%s) and no decoder is tried",
           err);

    for (int r = 0; r < 3; r++)
        drop(rigs[r]);
}

/* The AUTO rule (jpeg_decode.h), a pure function: the cases the H100
 * measurements decided, and the forms only the hybrid backends take. */
static void rule_cases(void)
{
    const int64_t small = 256 * 256, large = 500 * 375;
    struct {
        int n;
        int64_t px;
        unsigned forms;
        int hw, gh;
        sf_cuda_jpeg_backend want;
        const char *what;
    } c[] = {
        {32, 32 * small, 0, 1, 1, SF_CUDA_JPEG_HARDWARE, "32 files of 256x256 (engines 16.1k vs 3.7k images/s)"},
        {256, 256 * small, 0, 1, 1, SF_CUDA_JPEG_GPU_HYBRID, "256 files of 256x256 (gpu_hybrid 43.3k vs 23.3k)"},
        {32, 32 * large, 0, 1, 1, SF_CUDA_JPEG_HARDWARE, "32 files of 500x375 (engines 20.7k vs 1.4k)"},
        {256, 256 * large, 0, 1, 1, SF_CUDA_JPEG_HARDWARE, "256 files of 500x375 (engines 26.6k vs 22.8k)"},
        {50, 50 * small, 0, 1, 1, SF_CUDA_JPEG_HARDWARE, "50 small files: Huffman would run on the CPU"},
        {256, 256 * small, SF_JPEG_FORM_PROGRESSIVE, 1, 1, SF_CUDA_JPEG_GPU_HYBRID, "a progressive file"},
        {8, 8 * small, SF_JPEG_FORM_EXTENDED, 1, 1, SF_CUDA_JPEG_GPU_HYBRID, "an extended (SOF1) file"},
        {8, 8 * small, SF_JPEG_FORM_CHROMA_4X, 1, 1, SF_CUDA_JPEG_GPU_HYBRID, "a 4:1:1 file"},
        {8, 8 * small, SF_JPEG_FORM_CHROMA_4X, 1, 0, SF_CUDA_JPEG_HYBRID, "a 4:1:1 file without gpu_hybrid"},
        {256, 256 * small, 0, 0, 1, SF_CUDA_JPEG_GPU_HYBRID, "no engines"},
        {256, 256 * small, 0, 1, 0, SF_CUDA_JPEG_HARDWARE, "no gpu_hybrid"},
    };
    for (const auto &k : c) {
        sf_cuda_jpeg_backend got = sf_cuda_jpeg_rule(k.n, k.px, k.forms, k.hw, k.gh);
        if (got == k.want)
            ok("auto rule: %s -> %s", k.what, sf_cuda_jpeg_backend_name(got));
        else
            fail("auto rule: %s -> %s, expected %s", k.what, sf_cuda_jpeg_backend_name(got),
                 sf_cuda_jpeg_backend_name(k.want));
    }
}

/* The synthetic file that sizes nvJPEG's buffers at start is a valid JPEG of
 * the size asked for, with no warning from libjpeg-turbo (which refuses
 * damaged files), and carries the entropy-coded bytes jpeg_decode.cu states. */
static void synthetic_file(void)
{
    const int sides[] = {8, 64, 433, 1024};
    for (int side : sides) {
        std::vector<uint8_t> f(sf_cuda_jpeg_synthetic_cap(side));
        const size_t len = sf_cuda_jpeg_synthetic(side, f.data());
        tjhandle tj = tjInitDecompress();
        int w = 0, h = 0, sub = -1, cs = -1;
        std::vector<uint8_t> px((size_t)side * side * 3);
        int rc = tjDecompressHeader3(tj, f.data(), len, &w, &h, &sub, &cs);
        rc = rc || tjDecompress2(tj, f.data(), len, px.data(), side, side * 3, side, TJPF_RGB, TJFLAG_STOPONWARNING);
        if (rc || w != side || h != side || sub != TJSAMP_444)
            fail("synthetic %dx%d JPEG: %s (%dx%d, subsampling %d)", side, side, rc ? tjGetErrorStr2(tj) : "ok",
                 w, h, sub);
        else
            ok("synthetic %dx%d JPEG decodes on libjpeg-turbo: 4:4:4, %zu bytes (%.2f bytes per pixel)", side, side,
               len, (double)len / ((double)side * side));
        tjDestroy(tj);
    }
}

/* nvJPEG's buffers are sized by sf_cuda_jpeg_new: batches of other sizes,
 * counts and layouts afterwards allocate nothing (the counting allocators). */
static void sized_once(const std::vector<jcase> &baseline, const std::vector<jcase> &with_prog)
{
    char err[200];
    const int maxb = 64;
    sf_cuda_jpeg *j = sf_cuda_jpeg_new(maxb, (int64_t)maxb * 200000, 1, 1, err, sizeof err);
    if (!j) {
        fail("sf_cuda_jpeg_new: %s", err);
        return;
    }
    sf_cuda_jpeg_mem m0;
    sf_cuda_jpeg_memory(j, &m0);
    if (m0.warm_failed) {
        char desc[1024];
        sf_cuda_jpeg_describe(j, desc, sizeof desc);
        fail("the build-time decode failed on %d backend(s): %s", m0.warm_failed, desc);
    } else {
        ok("nvJPEG buffers sized at start: %.1f MiB device, %.1f MiB pinned", m0.device_bytes / 1048576.0,
           m0.pinned_bytes / 1048576.0);
    }
    cudaStream_t s;
    cudaStreamCreate(&s);
    std::vector<jcase> full_small(maxb, jcase{256, 256, TJSAMP_420, 0, "420"});
    std::vector<jcase> full_large(maxb, jcase{375, 500, TJSAMP_420, 0, "420"});
    std::vector<jcase> one = {{375, 500, TJSAMP_444, 0, "444"}};
    const std::vector<jcase> *lists[] = {&baseline, &full_small, &full_large, &one, &with_prog};
    const sf_cuda_jpeg_backend bes[] = {SF_CUDA_JPEG_AUTO, SF_CUDA_JPEG_HARDWARE, SF_CUDA_JPEG_GPU_HYBRID,
                                        SF_CUDA_JPEG_HYBRID};
    jbatch jb;
    int runs = 0;
    /* Two passes over the same batches: the first shows what the build-time
     * decode did not cover (measured on the H100: 7 buffers, 3.3 MiB, for
     * forms other than its synthetic 4:4:4 baseline batch); the second must
     * allocate nothing, so no batch in steady state allocates. */
    sf_cuda_jpeg_mem mid;
    memset(&mid, 0, sizeof mid);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            sf_cuda_jpeg_memory(j, &mid);
        int k = 0;
        for (const std::vector<jcase> *l : lists) {
            make_batch(jb, *l, 500 + (uint64_t)k++);
            for (sf_cuda_jpeg_backend be : bes) {
                if (be != SF_CUDA_JPEG_AUTO && !sf_cuda_jpeg_has(j, be))
                    continue;
                /* hybrid is sized at start only where it is AUTO's fallback. */
                if (be == SF_CUDA_JPEG_HYBRID && sf_cuda_jpeg_has(j, SF_CUDA_JPEG_GPU_HYBRID))
                    continue;
                if (be == SF_CUDA_JPEG_HARDWARE && jb.forms)
                    continue;
                sf_cuda_clear_error();
                if (sf_cuda_jpeg_decode(j, &jb.b, be, 0, NULL, s) != 0 || cudaStreamSynchronize(s) != cudaSuccess) {
                    fail("%s: %d files: %s", sf_cuda_jpeg_backend_name(be), jb.b.n, sf_cuda_last_error());
                    continue;
                }
                runs++;
            }
        }
    }
    sf_cuda_jpeg_mem m1;
    sf_cuda_jpeg_memory(j, &m1);
    printf("info the first pass allocated %lld nvJPEG buffers after the build (%.1f MiB device, %.1f MiB pinned)\n",
           mid.allocs_after_build, mid.device_bytes / 1048576.0, mid.pinned_bytes / 1048576.0);
    if (m1.allocs_after_build == mid.allocs_after_build)
        ok("%d decodes (1 to %d files, 4:2:0 to 4:4:4, progressive): the second pass allocated nothing", runs, maxb);
    else
        fail("%d decodes: the second pass over the same batches allocated %lld more nvJPEG buffers (now %.1f MiB "
             "device, %.1f MiB pinned)",
             runs, m1.allocs_after_build - mid.allocs_after_build, m1.device_bytes / 1048576.0,
             m1.pinned_bytes / 1048576.0);
    cudaStreamDestroy(s);
    sf_cuda_jpeg_free(j);
}

/* Lanes (jpeg_decode.h): a batch cut into slices decoded at once by other
 * nvJPEG decoders gives the bytes one decoder gives, on every backend. */
static void lanes_equal_one_decoder(void)
{
    char err[200];
    const int n = 2 * SF_CUDA_JPEG_LANE_MIN + 37;
    std::vector<jcase> base, prog;
    for (int i = 0; i < n; i++) {
        base.push_back(i % 3 ? jcase{256, 256, TJSAMP_420, 0, "420"} : jcase{375, 500, TJSAMP_444, 0, "444"});
        prog.push_back(i % 5 ? base.back() : jcase{200, 300, TJSAMP_420, 1, "420p"});
    }
    const int64_t px = (int64_t)n * 375 * 500;
    sf_cuda_jpeg *j1 = sf_cuda_jpeg_new(n, px, 1, 1, err, sizeof err);
    sf_cuda_jpeg *j2 = j1 ? sf_cuda_jpeg_new(n, px, 1, 2, err, sizeof err) : NULL;
    if (!j1 || !j2) {
        fail("lanes: sf_cuda_jpeg_new: %s", err);
        sf_cuda_jpeg_free(j1);
        return;
    }
    cudaStream_t s;
    cudaStreamCreate(&s);
    jbatch jb;
    const sf_cuda_jpeg_backend bes[] = {SF_CUDA_JPEG_AUTO, SF_CUDA_JPEG_HARDWARE, SF_CUDA_JPEG_GPU_HYBRID};
    for (int v = 0; v < 2; v++) {
        make_batch(jb, v ? prog : base, 900 + (uint64_t)v);
        for (sf_cuda_jpeg_backend be : bes) {
            if ((be != SF_CUDA_JPEG_AUTO && !sf_cuda_jpeg_has(j1, be)) || (be == SF_CUDA_JPEG_HARDWARE && jb.forms))
                continue;
            std::vector<uint8_t> a(jb.decoded), b(jb.decoded);
            sf_cuda_clear_error();
            CU(cudaMemset(sf_cuda_jpeg_output(j1, 0), 1, jb.decoded));
            CU(cudaMemset(sf_cuda_jpeg_output(j2, 0), 2, jb.decoded));
            if (sf_cuda_jpeg_decode(j1, &jb.b, be, 0, NULL, s) || sf_cuda_jpeg_decode(j2, &jb.b, be, 0, NULL, s) ||
                cudaStreamSynchronize(s) != cudaSuccess) {
                fail("lanes %s: %s", sf_cuda_jpeg_backend_name(be), sf_cuda_last_error());
                continue;
            }
            CU(cudaMemcpy(a.data(), sf_cuda_jpeg_output(j1, 0), jb.decoded, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(b.data(), sf_cuda_jpeg_output(j2, 0), jb.decoded, cudaMemcpyDeviceToHost));
            size_t diff = 0;
            for (size_t i = 0; i < a.size(); i++)
                diff += a[i] != b[i];
            if (diff == 0)
                ok("%d files%s on %s (ran on %s): two lanes decode the bytes one decoder does", n,
                   v ? " (some progressive)" : "", sf_cuda_jpeg_backend_name(be),
                   sf_cuda_jpeg_backend_name(sf_cuda_jpeg_last(j2)));
            else
                fail("%d files on %s: two lanes differ from one decoder in %zu of %zu bytes", n,
                     sf_cuda_jpeg_backend_name(be), diff, a.size());
        }
    }
    cudaStreamDestroy(s);
    sf_cuda_jpeg_free(j2);
    sf_cuda_jpeg_free(j1);
}

/* A file nvJPEG refuses (a bogus Huffman table: more codes of length 1 than
 * exist) is left out with skip_undecodable; a file with a second file after
 * its EOI (multi-picture camera files) decodes as its first image: it is marked, every other
 * sample decodes as libjpeg-turbo decodes it; a CMYK file (4 components,
 * which nvJPEG does not take) is decoded on the host, exactly as the
 * reference decodes it; without skipping the bogus file fails the batch
 * naming it, and a batch of bogus files only is refused with skipping too. */
static std::vector<uint8_t> cmyk_file(int h, int w)
{
    std::vector<uint8_t> px((size_t)h * w * 4);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < 4; k++)
                px[((size_t)y * w + x) * 4 + k] = (uint8_t)((x * 7 + y * 3 + k * 60) & 255);
    tjhandle tj = tjInitCompress();
    unsigned char *out = NULL;
    unsigned long len = 0;
    std::vector<uint8_t> f;
    if (tjCompress2(tj, px.data(), w, w * 4, h, TJPF_CMYK, &out, &len, TJSAMP_444, 90, 0) == 0)
        f.assign(out, out + len);
    else
        fail("encode CMYK: %s", tjGetErrorStr2(tj));
    tjFree(out);
    tjDestroy(tj);
    return f;
}

static void undecodable_left_out_and_cmyk_on_the_host(const std::vector<jcase> &baseline)
{
    char err[200];
    sf_cuda_jpeg *j = sf_cuda_jpeg_new(64, 4 << 20, 1, 1, err, sizeof err);
    if (!j) {
        fail("sf_cuda_jpeg_new: %s", err);
        return;
    }
    cudaStream_t s;
    cudaStreamCreate(&s);
    jbatch jb;
    make_batch(jb, baseline, 21);
    /* sample 1 becomes a bogus-Huffman file; the last sample is a CMYK file */
    const int bad = 1, cm = (int)baseline.size() - 1;
    {
        const int64_t o0 = jb.off[bad];
        for (int64_t k = o0 + 2; k + 5 < jb.off[bad + 1]; k++)
            if (jb.bytes[k] == 0xFF && jb.bytes[k + 1] == 0xC4) {
                jb.bytes[k + 5] = 0xFF;
                break;
            }
    }
    std::vector<uint8_t> c = cmyk_file(jb.smp[cm].src_h, jb.smp[cm].src_w);
    jb.bytes.resize((size_t)jb.off[cm]);
    jb.bytes.insert(jb.bytes.end(), c.begin(), c.end());
    jb.off[cm + 1] = (int64_t)jb.bytes.size();
    /* Sample 0 carries a second JPEG file after its EOI, as multi-picture
     * (MPF) camera files do; the server's header read passes the whole file
     * (it ends with EOI), so every decoder must stop at the first EOI. */
    {
        const int64_t l0 = jb.off[1];
        std::vector<uint8_t> tail(jb.bytes.begin() + jb.off[2], jb.bytes.begin() + jb.off[3]);
        jb.bytes.insert(jb.bytes.begin() + l0, tail.begin(), tail.end());
        for (size_t k = 1; k < jb.off.size(); k++)
            jb.off[k] += (int64_t)tail.size();
    }
    jb.b.jpeg = jb.bytes.data();
    std::vector<sf_jpeg_file> files(baseline.size());
    for (size_t i = 0; i < files.size(); i++)
        files[i] = {jb.off[i + 1] - jb.off[i], 0u, 1};
    files[cm].forms = SF_JPEG_FORM_CMYK;
    jb.b.jpeg_files = files.data();
    jb.b.jpeg_forms |= SF_JPEG_FORM_CMYK;
    std::vector<uint8_t> marks(baseline.size(), 7), ref(jb.decoded, 0), rbad(baseline.size(), 0);
    if (sf_ref_image_decode_some(&jb.b, NULL, ref.data(), ref.size(), rbad.data(), err, sizeof err) != 1 || !rbad[bad])
        fail("libjpeg-turbo did not refuse the bogus file alone: %s", err);
    jb.b.skip_undecodable = 1;
    jb.b.undecodable = marks.data();
    const sf_cuda_jpeg_backend bes[] = {SF_CUDA_JPEG_AUTO, SF_CUDA_JPEG_GPU_HYBRID, SF_CUDA_JPEG_HYBRID};
    for (sf_cuda_jpeg_backend be : bes) {
        if (be != SF_CUDA_JPEG_AUTO && !sf_cuda_jpeg_has(j, be))
            continue;
        const char *name = sf_cuda_jpeg_backend_name(be);
        cudaMemset(sf_cuda_jpeg_output(j, 0), 0xEE, jb.decoded);
        sf_cuda_clear_error();
        int rc = sf_cuda_jpeg_decode(j, &jb.b, be, 0, NULL, s);
        rc = rc || cudaStreamSynchronize(s) != cudaSuccess;
        if (rc) {
            fail("%s: a batch with one bogus file failed with skipping on: %s", name, sf_cuda_last_error());
            continue;
        }
        int marked = 0;
        for (size_t i = 0; i < marks.size(); i++)
            marked += marks[i] != 0;
        if (marks[bad] != 1 || marked != 1)
            fail("%s: %d samples marked left out (sample %d: %d); want sample %d alone", name, marked, bad,
                 marks[bad], bad);
        else
            ok("%s: the bogus file is left out, the other %zu samples decode", name, marks.size() - 1);
        if (sf_cuda_jpeg_host_decoded(j) != 1)
            fail("%s: %d files decoded on the host; want the CMYK one", name, sf_cuda_jpeg_host_decoded(j));
        std::vector<uint8_t> got(jb.decoded);
        cudaMemcpy(got.data(), sf_cuda_jpeg_output(j, 0), jb.decoded, cudaMemcpyDeviceToHost);
        const size_t co = jb.smp[cm].src_off, cl = (size_t)jb.smp[cm].src_h * jb.smp[cm].src_w * 3;
        if (memcmp(got.data() + co, ref.data() + co, cl) != 0)
            fail("%s: the CMYK file decoded on the host differs from the reference decode", name);
        else
            ok("%s: the CMYK file, decoded on the host, equals the reference decode", name);
        std::vector<jcase> others;
        jbatch rest = jb;
        rest.smp.clear();
        for (size_t k = 0; k + 1 < baseline.size(); k++)
            if ((int)k != bad) {
                others.push_back(baseline[k]);
                rest.smp.push_back(jb.smp[k]);
            }
        compare(name, others, rest, got.data(), ref.data());
    }
    /* Without skipping: the batch fails naming the bogus file. */
    jb.b.skip_undecodable = 0;
    sf_cuda_clear_error();
    int rc = sf_cuda_jpeg_decode(j, &jb.b, SF_CUDA_JPEG_AUTO, 0, NULL, s);
    cudaStreamSynchronize(s);
    cudaGetLastError();
    if (rc != SF_BACKEND_BAD_INPUT || !strstr(sf_cuda_last_error(), "sample 1"))
        fail("without skipping, the bogus file gave %d: %s", rc, sf_cuda_last_error());
    else
        ok("without skipping, the bogus file fails the batch: %s", sf_cuda_last_error());
    /* With skipping, a batch of bogus files only is refused. */
    jbatch one;
    std::vector<jcase> single(baseline.begin(), baseline.begin() + 1);
    make_batch(one, single, 22);
    for (size_t k = 2; k + 5 < one.bytes.size(); k++)
        if (one.bytes[k] == 0xFF && one.bytes[k + 1] == 0xC4) {
            one.bytes[k + 5] = 0xFF;
            break;
        }
    std::vector<uint8_t> m1(1, 0);
    one.b.skip_undecodable = 1;
    one.b.undecodable = m1.data();
    rc = sf_cuda_jpeg_decode(j, &one.b, SF_CUDA_JPEG_AUTO, 0, NULL, s);
    cudaStreamSynchronize(s);
    cudaGetLastError();
    if (rc != SF_BACKEND_BAD_INPUT || m1[0] != 1)
        fail("a batch of one bogus file gave %d (mark %d); want it refused", rc, m1[0]);
    else
        ok("a batch of which no file decodes is refused with skipping on");
    cudaStreamDestroy(s);
    sf_cuda_jpeg_free(j);
}

/* h x w RGB pixels as a PNG (libspng's encoder) or a lossless WebP. */
static std::vector<uint8_t> png_file(const std::vector<uint8_t> &px, int h, int w)
{
    std::vector<uint8_t> f;
    spng_ctx *enc = spng_ctx_new(SPNG_CTX_ENCODER);
    struct spng_ihdr ihdr = {(uint32_t)w, (uint32_t)h, 8, SPNG_COLOR_TYPE_TRUECOLOR, 0, 0, 0};
    size_t n = 0;
    int e = 0;
    spng_set_option(enc, SPNG_ENCODE_TO_BUFFER, 1);
    spng_set_ihdr(enc, &ihdr);
    if (spng_encode_image(enc, px.data(), px.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE) == 0) {
        uint8_t *out = (uint8_t *)spng_get_png_buffer(enc, &n, &e);
        if (out) {
            f.assign(out, out + n);
            free(out);
        }
    }
    spng_ctx_free(enc);
    return f;
}

static std::vector<uint8_t> webp_file(const std::vector<uint8_t> &px, int h, int w)
{
    uint8_t *out = NULL;
    const size_t n = WebPEncodeLosslessRGB(px.data(), w, h, w * 3, &out);
    std::vector<uint8_t> f(out, out + n);
    WebPFree(out);
    return f;
}

static void png_webp_and_turned_files_on_the_host(const std::vector<jcase> &baseline)
{
    char err[200];
    sf_cuda_jpeg *j = sf_cuda_jpeg_new(8, 1 << 20, 1, 1, err, sizeof err);
    if (!j) {
        fail("sf_cuda_jpeg_new: %s", err);
        return;
    }
    cudaStream_t s;
    cudaStreamCreate(&s);
    /* A JPEG nvJPEG decodes, a PNG, a WebP, and a JPEG of orientation 6,
     * whose sample is its file turned (47 x 33 for a 33 x 47 file). */
    const std::vector<jcase> cases = {baseline[0], {24, 40, TJSAMP_444, 0, "png"}, {40, 24, TJSAMP_444, 0, "webp"},
                                      {33, 47, TJSAMP_420, 0, "turned"}};
    jbatch jb;
    make_batch(jb, cases, 31);
    std::vector<uint8_t> px((size_t)24 * 40 * 3);
    for (size_t k = 0; k < px.size(); k++)
        px[k] = (uint8_t)(k * 7 + (k / 120) * 13);
    std::vector<std::vector<uint8_t>> file(4);
    for (int i = 0; i < 4; i++)
        file[i].assign(jb.bytes.begin() + jb.off[i], jb.bytes.begin() + jb.off[i + 1]);
    file[1] = png_file(px, 24, 40);
    file[2] = webp_file(px, 40, 24);
    if (file[1].empty() || file[2].empty()) {
        fail("encoding the PNG or WebP file failed");
        sf_cuda_jpeg_free(j);
        return;
    }
    jb.bytes.clear();
    for (int i = 0; i < 4; i++) {
        jb.bytes.insert(jb.bytes.end(), file[i].begin(), file[i].end());
        jb.off[i + 1] = (int64_t)jb.bytes.size();
    }
    jb.smp[3].src_h = 47;
    jb.smp[3].src_w = 33;
    jb.b.jpeg = jb.bytes.data();
    std::vector<sf_jpeg_file> files(4);
    for (int i = 0; i < 4; i++)
        files[i] = {jb.off[i + 1] - jb.off[i], 0u, 1};
    files[1].forms = SF_JPEG_FORM_PNG;
    files[2].forms = SF_JPEG_FORM_WEBP;
    files[3].forms = SF_JPEG_FORM_ORIENTED;
    files[3].orientation = 6;
    jb.b.jpeg_files = files.data();
    jb.b.jpeg_forms = SF_JPEG_FORM_PNG | SF_JPEG_FORM_WEBP | SF_JPEG_FORM_ORIENTED;
    std::vector<uint8_t> ref(jb.decoded), got(jb.decoded);
    if (sf_ref_image_decode(&jb.b, ref.data(), ref.size(), err, sizeof err)) {
        fail("the reference decode of the PNG, WebP and turned files: %s", err);
    } else if (memcmp(ref.data() + jb.smp[1].src_off, px.data(), px.size()) != 0 ||
               memcmp(ref.data() + jb.smp[2].src_off, px.data(), px.size()) != 0) {
        fail("the reference decode of the lossless PNG and WebP files differs from their pixels");
    } else {
        cudaMemset(sf_cuda_jpeg_output(j, 0), 0xEE, jb.decoded);
        sf_cuda_clear_error();
        int rc = sf_cuda_jpeg_decode(j, &jb.b, SF_CUDA_JPEG_AUTO, 0, NULL, s);
        rc = rc || cudaStreamSynchronize(s) != cudaSuccess;
        cudaMemcpy(got.data(), sf_cuda_jpeg_output(j, 0), jb.decoded, cudaMemcpyDeviceToHost);
        const size_t host_from = jb.smp[1].src_off;
        if (rc)
            fail("a batch of JPEG, PNG, WebP and a turned JPEG failed: %s", sf_cuda_last_error());
        else if (sf_cuda_jpeg_host_decoded(j) != 3)
            fail("%d files decoded on the host; want the PNG, the WebP and the turned JPEG",
                 sf_cuda_jpeg_host_decoded(j));
        else if (memcmp(got.data() + host_from, ref.data() + host_from, jb.decoded - host_from) != 0)
            fail("the PNG, WebP and turned JPEG decoded on the host differ from the reference decode");
        else
            ok("the PNG, the WebP and the turned JPEG decode on the host, as the reference decodes them");
    }
    cudaStreamDestroy(s);
    sf_cuda_jpeg_free(j);
}

int main(int argc, char **argv)
{
    test_sections sec("test_jpeg_decode",
                      {"rules", "synthetic", "decode", "auto", "damaged", "staging", "sized_once", "lanes",
                       "through_backends", "overlapped", "undecodable", "host_formats", "first_encoded"});
    const int arg_rc = sec.args(argc, argv);
    if (arg_rc >= 0)
        return arg_rc;
    /* Neither needs a device. */
    if (sec.run("rules"))
        rule_cases();
    if (sec.run("synthetic"))
        synthetic_file();
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIPPED: no CUDA device (the device-free sections selected ran: %d ok, %d failed)\n", g_ok, g_fail);
        return g_fail ? 1 : 0;
    }
    const std::vector<jcase> baseline = {
        {64, 64, TJSAMP_444, 0, "444"},     {64, 64, TJSAMP_422, 0, "422"},
        {64, 64, TJSAMP_420, 0, "420"},     {64, 64, TJSAMP_GRAY, 0, "gray"},
        {256, 256, TJSAMP_420, 0, "420"},   {375, 500, TJSAMP_420, 0, "420"},
        {375, 500, TJSAMP_444, 0, "444"},   {33, 47, TJSAMP_420, 0, "420 odd"},
        {47, 33, TJSAMP_422, 0, "422 odd"}, {17, 301, TJSAMP_GRAY, 0, "gray odd"},
    };
    std::vector<jcase> with_prog = baseline;
    with_prog.push_back({256, 256, TJSAMP_420, 1, "420 progressive"});
    with_prog.push_back({33, 47, TJSAMP_444, 1, "444 progressive odd"});

    char err[200];
    /* The decoder, its stream and the batch the sections decode, auto,
     * damaged and staging share: made by the first of them that runs, freed
     * after the last. A decoder that cannot be made ends the program. */
    sf_cuda_jpeg *j = NULL;
    cudaStream_t s = NULL;
    jbatch jb;
    auto need_decoder = [&]() -> int {
        if (j)
            return 0;
        j = sf_cuda_jpeg_new(64, 4 << 20, 1, 1, err, sizeof err);
        if (!j) {
            fail("sf_cuda_jpeg_new: %s", err);
            return 1;
        }
        char desc[1024];
        sf_cuda_jpeg_describe(j, desc, sizeof desc);
        printf("%s", desc);
        cudaStreamCreate(&s);
        return 0;
    };
    const sf_cuda_jpeg_backend bes[] = {SF_CUDA_JPEG_HARDWARE, SF_CUDA_JPEG_GPU_HYBRID, SF_CUDA_JPEG_HYBRID};
    if (sec.run("decode")) {
        if (need_decoder())
            return 1;
        for (sf_cuda_jpeg_backend be : bes) {
            const char *name = sf_cuda_jpeg_backend_name(be);
            if (!sf_cuda_jpeg_has(j, be)) {
                printf("SKIPPED %s: not available on this device\n", name);
                continue;
            }
            const std::vector<jcase> &cases = be == SF_CUDA_JPEG_HARDWARE ? baseline : with_prog;
            make_batch(jb, cases, 1000 + (uint64_t)be);
            std::vector<uint8_t> ref(jb.decoded), got(jb.decoded, 0xEE);
            if (sf_ref_image_decode(&jb.b, ref.data(), ref.size(), err, sizeof err)) {
                fail("libjpeg-turbo: %s", err);
                continue;
            }
            /* Poisoned first, so a sample nvJPEG does not write fails. */
            cudaMemset(sf_cuda_jpeg_output(j, 0), 0xEE, jb.decoded);
            sf_cuda_clear_error();
            if (sf_cuda_jpeg_decode(j, &jb.b, be, 0, NULL, s) != 0 || cudaStreamSynchronize(s) != cudaSuccess) {
                fail("%s: decode failed: %s", name, sf_cuda_last_error());
                continue;
            }
            cudaMemcpy(got.data(), sf_cuda_jpeg_output(j, 0), jb.decoded, cudaMemcpyDeviceToHost);
            compare(name, cases, jb, got.data(), ref.data());
        }
    }

    /* AUTO: hardware for an all-baseline batch where the engines exist;
     * gpu_hybrid (or hybrid) as soon as one file is progressive. */
    if (sec.run("auto")) {
        if (need_decoder())
            return 1;
        make_batch(jb, baseline, 7);
        if (sf_cuda_jpeg_decode(j, &jb.b, SF_CUDA_JPEG_AUTO, 0, NULL, s) != 0 ||
            cudaStreamSynchronize(s) != cudaSuccess)
            fail("auto, baseline: %s", sf_cuda_last_error());
        else if (sf_cuda_jpeg_has(j, SF_CUDA_JPEG_HARDWARE) != (sf_cuda_jpeg_last(j) == SF_CUDA_JPEG_HARDWARE))
            fail("auto chose %s for a baseline batch", sf_cuda_jpeg_backend_name(sf_cuda_jpeg_last(j)));
        else
            ok("auto runs a baseline batch on %s", sf_cuda_jpeg_backend_name(sf_cuda_jpeg_last(j)));
        make_batch(jb, with_prog, 8);
        if (sf_cuda_jpeg_decode(j, &jb.b, SF_CUDA_JPEG_AUTO, 0, NULL, s) != 0 ||
            cudaStreamSynchronize(s) != cudaSuccess)
            fail("auto, progressive: %s", sf_cuda_last_error());
        else if (sf_cuda_jpeg_last(j) == SF_CUDA_JPEG_HARDWARE)
            fail("auto ran a batch with progressive files on the hardware engines");
        else
            ok("auto runs a batch with a progressive file on %s", sf_cuda_jpeg_backend_name(sf_cuda_jpeg_last(j)));
    }

    /* Damaged scan data (the file cut inside its scan, EOI appended: a valid
     * header). libjpeg-turbo refuses it; nvJPEG, even with strict bitstreams,
     * decodes such a file on an H100 without an error (measured: every
     * backend). So the CUDA decode either fails the batch naming the sample,
     * or keeps the damage inside that sample: every other sample of the batch
     * decodes as libjpeg-turbo decodes it. */
    if (sec.run("damaged")) {
        if (need_decoder())
            return 1;
        for (sf_cuda_jpeg_backend be : bes) {
            if (!sf_cuda_jpeg_has(j, be))
                continue;
            make_batch(jb, baseline, 9);
            std::vector<uint8_t> clean(jb.decoded);
            if (sf_ref_image_decode(&jb.b, clean.data(), clean.size(), err, sizeof err)) {
                fail("libjpeg-turbo: %s", err);
                continue;
            }
            cudaMemset(sf_cuda_jpeg_output(j, 0), 0xEE, jb.decoded);
            const int bad = 2;
            const int64_t o0 = jb.off[bad], o1 = jb.off[bad + 1];
            std::vector<uint8_t> f(jb.bytes.begin() + o0, jb.bytes.begin() + o1);
            size_t sos = 0;
            for (size_t k = 2; k + 1 < f.size(); k++)
                if (f[k] == 0xFF && f[k + 1] == 0xDA) {
                    sos = k;
                    break;
                }
            f.resize(sos + 40);
            f.push_back(0xFF);
            f.push_back(0xD9);
            std::vector<uint8_t> bytes(jb.bytes.begin(), jb.bytes.begin() + o0);
            bytes.insert(bytes.end(), f.begin(), f.end());
            bytes.insert(bytes.end(), jb.bytes.begin() + o1, jb.bytes.end());
            const int64_t shift = (int64_t)f.size() - (o1 - o0);
            for (size_t k = bad + 1; k < jb.off.size(); k++)
                jb.off[k] += shift;
            jb.bytes = bytes;
            jb.b.jpeg = jb.bytes.data();
            char rerr[200];
            std::vector<uint8_t> ref(jb.decoded);
            const int ref_rc = sf_ref_image_decode(&jb.b, ref.data(), ref.size(), rerr, sizeof rerr);
            sf_cuda_clear_error();
            int rc = sf_cuda_jpeg_decode(j, &jb.b, be, 0, NULL, s);
            rc = rc || cudaStreamSynchronize(s) != cudaSuccess;
            cudaGetLastError();
            char want[32];
            snprintf(want, sizeof want, "sample %d", bad);
            if (ref_rc == 0) {
                fail("libjpeg-turbo decoded the damaged sample %d: the damage does not test anything", bad);
            } else if (rc != 0) {
                if (strstr(sf_cuda_last_error(), want))
                    ok("%s: damaged scan data fails the batch naming the sample: %s", sf_cuda_jpeg_backend_name(be),
                       sf_cuda_last_error());
                else
                    fail("%s: damaged scan data fails the batch without naming sample %d: %s",
                         sf_cuda_jpeg_backend_name(be), bad, sf_cuda_last_error());
            } else {
                std::vector<uint8_t> got(jb.decoded);
                cudaMemcpy(got.data(), sf_cuda_jpeg_output(j, 0), jb.decoded, cudaMemcpyDeviceToHost);
                std::vector<jcase> others;
                jbatch rest = jb;
                rest.smp.clear();
                for (size_t k = 0; k < baseline.size(); k++)
                    if ((int)k != bad) {
                        others.push_back(baseline[k]);
                        rest.smp.push_back(jb.smp[k]);
                    }
                printf("note: %s decodes damaged scan data without an error; checking the other samples\n",
                       sf_cuda_jpeg_backend_name(be));
                compare(sf_cuda_jpeg_backend_name(be), others, rest, got.data(), clean.data());
            }
        }
    }

    /* A batch that does not fit the staging area is refused before any work
     * (the batch the sections before left, or a baseline batch). */
    if (sec.run("staging")) {
        if (need_decoder())
            return 1;
        if (jb.smp.empty())
            make_batch(jb, baseline, 9);
        jb.smp[0].src_off = (size_t)4 << 22;
        if (sf_cuda_jpeg_decode(j, &jb.b, SF_CUDA_JPEG_AUTO, 0, NULL, s) == 0)
            fail("a batch past the staging area was decoded");
        else
            ok("a batch past the staging area is refused: %s", sf_cuda_last_error());
    }

    if (j) {
        cudaStreamDestroy(s);
        sf_cuda_jpeg_free(j);
    }
    if (sec.run("sized_once"))
        sized_once(baseline, with_prog);
    if (sec.run("lanes"))
        lanes_equal_one_decoder();
    if (sec.run("through_backends"))
        through_backends(with_prog);
    if (sec.run("overlapped"))
        overlapped_decode_equals_serial(baseline);
    if (sec.run("undecodable"))
        undecodable_left_out_and_cmyk_on_the_host(baseline);
    if (sec.run("host_formats"))
        png_webp_and_turned_files_on_the_host(baseline);
    if (sec.run("first_encoded"))
        decoder_made_by_the_first_encoded_batch(baseline);
    return report("test_jpeg_decode");
}
