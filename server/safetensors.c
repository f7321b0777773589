/* server/safetensors.c — incremental safetensors parser and header writer.
 * The contract is documented in safetensors.h. */
#include "server/safetensors.h"

#include <cjson/cJSON.h>
#include "server/image_header.h"
#include "server/text.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Integers in the header are JSON numbers that cJSON reads as doubles; every
 * integer up to 2^53 is exact, and nothing larger is accepted. */
#define MAX_JSON_INT ((uint64_t)1 << 53)

/* ---- dtypes --------------------------------------------------------------- */

static const char *const dtype_names[SF_ST_DTYPE_COUNT] = {
    [SF_ST_U8] = "U8",     [SF_ST_I8] = "I8",           [SF_ST_U16] = "U16",
    [SF_ST_I16] = "I16",   [SF_ST_I32] = "I32",         [SF_ST_I64] = "I64",
    [SF_ST_F16] = "F16",   [SF_ST_BF16] = "BF16",       [SF_ST_F32] = "F32",
    [SF_ST_F64] = "F64",   [SF_ST_BOOL] = "BOOL",       [SF_ST_U32] = "U32",
    [SF_ST_U64] = "U64",   [SF_ST_F8_E5M2] = "F8_E5M2", [SF_ST_F8_E4M3] = "F8_E4M3",
    [SF_ST_F8_E8M0] = "F8_E8M0", [SF_ST_C64] = "C64",
};

static const int dtype_sizes[SF_ST_DTYPE_COUNT] = {
    [SF_ST_U8] = 1,  [SF_ST_I8] = 1,  [SF_ST_U16] = 2,     [SF_ST_I16] = 2,
    [SF_ST_I32] = 4, [SF_ST_I64] = 8, [SF_ST_F16] = 2,     [SF_ST_BF16] = 2,
    [SF_ST_F32] = 4, [SF_ST_F64] = 8, [SF_ST_BOOL] = 1,    [SF_ST_U32] = 4,
    [SF_ST_U64] = 8, [SF_ST_F8_E5M2] = 1, [SF_ST_F8_E4M3] = 1, [SF_ST_F8_E8M0] = 1,
    [SF_ST_C64] = 8,
};

/* Dtypes of the safetensors format that sf_st_dtype does not represent
 * (sub-byte floats, FNUZ variants): known, hence "unsupported", not "unknown". */
static const char *const other_known_dtypes[] = {
    "F4", "F6_E2M3", "F6_E3M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
};

const char *sf_st_dtype_name(sf_st_dtype d)
{
    if ((int)d < 0 || d >= SF_ST_DTYPE_COUNT) return NULL;
    return dtype_names[d];
}

int sf_st_dtype_size(sf_st_dtype d)
{
    if ((int)d < 0 || d >= SF_ST_DTYPE_COUNT) return 0;
    return dtype_sizes[d];
}

int sf_st_dtype_parse(const char *s, sf_st_dtype *out)
{
    if (!s) return -1;
    for (int i = 0; i < SF_ST_DTYPE_COUNT; i++) {
        if (strcmp(s, dtype_names[i]) == 0) {
            if (out) *out = (sf_st_dtype)i;
            return 0;
        }
    }
    return -1;
}

static int dtype_is_other_known(const char *s)
{
    for (size_t i = 0; i < sizeof other_known_dtypes / sizeof other_known_dtypes[0]; i++)
        if (strcmp(s, other_known_dtypes[i]) == 0) return 1;
    return 0;
}

/* ---- errors --------------------------------------------------------------- */

static const char *const error_names[SF_ST_ERROR_COUNT] = {
    [SF_ST_OK] = "ok",
    [SF_ST_E_HEADER_LENGTH_INVALID] = "header_length_invalid",
    [SF_ST_E_HEADER_TOO_LARGE] = "header_too_large",
    [SF_ST_E_HEADER_NOT_JSON] = "header_not_json",
    [SF_ST_E_HEADER_NOT_OBJECT] = "header_not_object",
    [SF_ST_E_HEADER_TOO_DEEP] = "header_too_deep",
    [SF_ST_E_DUPLICATE_KEY] = "duplicate_key",
    [SF_ST_E_BAD_METADATA] = "bad_metadata",
    [SF_ST_E_UNKNOWN_TENSOR] = "unknown_tensor",
    [SF_ST_E_BAD_TENSOR] = "bad_tensor",
    [SF_ST_E_MISSING_IMAGES] = "missing_images",
    [SF_ST_E_MISSING_LABELS] = "missing_labels",
    [SF_ST_E_UNKNOWN_DTYPE] = "unknown_dtype",
    [SF_ST_E_UNSUPPORTED_DTYPE] = "unsupported_dtype",
    [SF_ST_E_BAD_SHAPE] = "bad_shape",
    [SF_ST_E_BAD_LAYOUT] = "bad_layout",
    [SF_ST_E_SHAPE_SIZE_MISMATCH] = "shape_size_mismatch",
    [SF_ST_E_BAD_OFFSETS] = "bad_offsets",
    [SF_ST_E_OFFSETS_OVERLAP] = "offsets_overlap",
    [SF_ST_E_DATA_NOT_CONTIGUOUS] = "data_not_contiguous",
    [SF_ST_E_LABEL_COUNT_MISMATCH] = "label_count_mismatch",
    [SF_ST_E_IMAGE_TOO_LARGE] = "image_too_large",
    [SF_ST_E_BATCH_TOO_LARGE] = "batch_too_large",
    [SF_ST_E_BODY_TOO_LARGE] = "body_too_large",
    [SF_ST_E_BODY_TOO_LONG] = "body_too_long",
    [SF_ST_E_BODY_TOO_SHORT] = "body_too_short",
    [SF_ST_E_LABEL_OUT_OF_RANGE] = "label_out_of_range",
    [SF_ST_E_SLOT_TOO_SMALL] = "slot_too_small",
    [SF_ST_E_OUT_OF_MEMORY] = "out_of_memory",
    [SF_ST_E_BAD_CALL] = "bad_call",
    [SF_ST_E_JPEG_OFFSETS_INVALID] = "jpeg_offsets_invalid",
    [SF_ST_E_JPEG_NOT_JPEG] = "jpeg_not_jpeg",
    [SF_ST_E_JPEG_TRUNCATED] = "jpeg_truncated",
    [SF_ST_E_JPEG_MALFORMED] = "jpeg_malformed",
    [SF_ST_E_JPEG_SIDE_TOO_LARGE] = "jpeg_side_too_large",
    [SF_ST_E_JPEG_TOO_MANY_PIXELS] = "jpeg_too_many_pixels",
    [SF_ST_E_JPEG_UNSUPPORTED] = "jpeg_unsupported",
    [SF_ST_E_PNG_TRUNCATED] = "png_truncated",
    [SF_ST_E_PNG_MALFORMED] = "png_malformed",
    [SF_ST_E_PNG_UNSUPPORTED] = "png_unsupported",
    [SF_ST_E_WEBP_TRUNCATED] = "webp_truncated",
    [SF_ST_E_WEBP_MALFORMED] = "webp_malformed",
    [SF_ST_E_WEBP_UNSUPPORTED] = "webp_unsupported",
    [SF_ST_E_JPEG_BATCH_TOO_LARGE] = "jpeg_batch_too_large",
};

const char *sf_st_error_name(sf_st_error e)
{
    if ((int)e < 0 || e >= SF_ST_ERROR_COUNT) return NULL;
    return error_names[e];
}

/* Records the first failure only; later ones are consequences. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void fail(sf_st_parser *p, sf_st_error e, const char *fmt, ...)
{
    if (p->state == SF_ST_FAILED) return;
    p->state = SF_ST_FAILED;
    p->err = e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof p->msg, fmt, ap);
    va_end(ap);
}

/* A name or value from the request, made safe to quote in a message: printable
 * ASCII only, truncated. */
static const char *quote(char *out, size_t cap, const char *s)
{
    size_t o = 0;
    for (size_t i = 0; s && s[i] && o + 1 < cap; i++) {
        if (i >= 40) {
            if (o + 4 < cap) { memcpy(out + o, "...", 3); o += 3; }
            break;
        }
        unsigned char ch = (unsigned char)s[i];
        out[o++] = (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\') ? (char)ch : '?';
    }
    out[o] = '\0';
    return out;
}

static const char *state_name(sf_st_state s)
{
    switch (s) {
    case SF_ST_HEADER: return "HEADER";
    case SF_ST_NEED_DEST: return "NEED_DEST";
    case SF_ST_DATA: return "DATA";
    case SF_ST_COMPLETE: return "COMPLETE";
    case SF_ST_FAILED: return "FAILED";
    }
    return "?";
}

/* ---- lifecycle ------------------------------------------------------------ */

static void apply_defaults(sf_st_limits *l)
{
    if (l->max_header_bytes == 0) l->max_header_bytes = SF_ST_DEFAULT_MAX_HEADER_BYTES;
    if (l->max_body_bytes == 0) l->max_body_bytes = SF_ST_DEFAULT_MAX_BODY_BYTES;
    if (l->max_n <= 0) l->max_n = SF_ST_DEFAULT_MAX_DIM;
    if (l->max_h <= 0) l->max_h = SF_ST_DEFAULT_MAX_DIM;
    if (l->max_w <= 0) l->max_w = SF_ST_DEFAULT_MAX_DIM;
    if (l->classes < 0) l->classes = 0;
}

void sf_st_init(sf_st_parser *p, const sf_st_limits *lim)
{
    memset(p, 0, sizeof *p);
    if (lim) p->lim = *lim;
    apply_defaults(&p->lim);
    p->state = SF_ST_HEADER;
    p->err = SF_ST_OK;
    p->bad_label_index = -1;
    p->bad_sample = -1;
}

void sf_st_free(sf_st_parser *p)
{
    if (!p) return;
    free(p->hdr);
    p->hdr = NULL;
}

void sf_st_reset(sf_st_parser *p)
{
    sf_st_limits lim = p->lim;
    sf_st_free(p);
    sf_st_init(p, &lim);
}

sf_st_state sf_st_state_of(const sf_st_parser *p) { return p->state; }

const sf_st_info *sf_st_info_of(const sf_st_parser *p) { return p->have_info ? &p->info : NULL; }

const char *sf_st_error_code(const sf_st_parser *p) { return error_names[p->err]; }

const char *sf_st_error_message(const sf_st_parser *p) { return p->err == SF_ST_OK ? "" : p->msg; }

sf_st_error sf_st_error_of(const sf_st_parser *p) { return p->err; }

int64_t sf_st_bad_label_index(const sf_st_parser *p) { return p->bad_label_index; }

int64_t sf_st_bad_label_value(const sf_st_parser *p) { return p->bad_label_value; }

int64_t sf_st_bad_sample(const sf_st_parser *p) { return p->bad_sample; }

/* ---- header: raw scan while it arrives ------------------------------------ */

/* Tracks strings and nesting depth byte by byte so that a too-deep header is
 * rejected before cJSON sees it, and rejects raw control characters and the
 * escape \u0000 (which would truncate a C string). For JSON that cJSON accepts
 * the scan is exact; for anything else cJSON rejects it later. */
static void scan_byte(sf_st_parser *p, unsigned char ch, uint64_t pos)
{
    if (p->scan_in_str) {
        if (p->scan_uhex > 0) {
            if (ch != '0') p->scan_unonzero = 1;
            if (--p->scan_uhex == 0 && !p->scan_unonzero)
                fail(p, SF_ST_E_HEADER_NOT_JSON,
                     "the header contains the escape \\u0000 (before byte %llu); NUL characters are not accepted in names or values",
                     (unsigned long long)pos);
        } else if (p->scan_esc) {
            p->scan_esc = 0;
            if (ch == 'u') { p->scan_uhex = 4; p->scan_unonzero = 0; }
        } else if (ch == '\\') {
            p->scan_esc = 1;
        } else if (ch == '"') {
            p->scan_in_str = 0;
        } else if (ch < 0x20) {
            fail(p, SF_ST_E_HEADER_NOT_JSON,
                 "the header contains the control character 0x%02x inside a string at byte %llu",
                 ch, (unsigned long long)pos);
        }
        return;
    }
    switch (ch) {
    case '"': p->scan_in_str = 1; break;
    case '{': case '[':
        if (++p->scan_depth > SF_ST_MAX_DEPTH)
            fail(p, SF_ST_E_HEADER_TOO_DEEP,
                 "the header JSON nests deeper than %d levels (at byte %llu)",
                 SF_ST_MAX_DEPTH, (unsigned long long)pos);
        break;
    case '}': case ']':
        if (p->scan_depth > 0) p->scan_depth--;
        break;
    case ' ': case '\t': case '\n': case '\r': break;
    default:
        if (ch < 0x20)
            fail(p, SF_ST_E_HEADER_NOT_JSON,
                 "the header contains the control character 0x%02x at byte %llu",
                 ch, (unsigned long long)pos);
        break;
    }
}

/* ---- header: validation once complete -------------------------------------- */

/* One header entry; the file reader hands these out as sf_st_entry. */
typedef sf_st_entry tensor;

/* A JSON number that is an integer in [0, 2^53]; -1 otherwise. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= (double)MAX_JSON_INT)) return -1; /* NaN fails too */
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return -1;                         /* not an integer */
    *out = u;
    return 0;
}

/* Reads one tensor entry: its structure, dtype name, shape (at most max_ndim
 * dimensions) and offsets. The checks that depend on the tensor's role come
 * later. */
static int parse_tensor(sf_st_parser *p, const cJSON *item, tensor *t, int max_ndim)
{
    char qn[64], qv[64];
    quote(qn, sizeof qn, item->string);
    t->name = item->string;
    if (!cJSON_IsObject(item)) {
        fail(p, SF_ST_E_BAD_TENSOR, "tensor \"%s\" is not a JSON object", qn);
        return -1;
    }
    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *f = item->child; f; f = f->next) {
        const cJSON **slot;
        if (strcmp(f->string, "dtype") == 0) slot = &dtype;
        else if (strcmp(f->string, "shape") == 0) slot = &shape;
        else if (strcmp(f->string, "data_offsets") == 0) slot = &offs;
        else {
            fail(p, SF_ST_E_BAD_TENSOR, "tensor \"%s\" has an unknown field \"%s\"", qn,
                 quote(qv, sizeof qv, f->string));
            return -1;
        }
        if (*slot) {
            fail(p, SF_ST_E_DUPLICATE_KEY, "tensor \"%s\" has the field \"%s\" twice", qn, f->string);
            return -1;
        }
        *slot = f;
    }
    if (!dtype || !shape || !offs) {
        fail(p, SF_ST_E_BAD_TENSOR, "tensor \"%s\" lacks the field \"%s\"", qn,
             !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
        return -1;
    }
    if (!cJSON_IsString(dtype)) {
        fail(p, SF_ST_E_BAD_TENSOR, "tensor \"%s\": dtype is not a string", qn);
        return -1;
    }
    if (sf_st_dtype_parse(dtype->valuestring, &t->dtype) != 0) {
        quote(qv, sizeof qv, dtype->valuestring);
        if (dtype_is_other_known(dtype->valuestring))
            fail(p, SF_ST_E_UNSUPPORTED_DTYPE, "tensor \"%s\": dtype \"%s\" is not supported", qn, qv);
        else
            fail(p, SF_ST_E_UNKNOWN_DTYPE, "tensor \"%s\": dtype \"%s\" is not a safetensors dtype", qn, qv);
        return -1;
    }
    if (!cJSON_IsArray(shape)) {
        fail(p, SF_ST_E_BAD_SHAPE, "tensor \"%s\": shape is not an array", qn);
        return -1;
    }
    int nd = 0;
    for (const cJSON *d = shape->child; d; d = d->next, nd++) {
        uint64_t v;
        if (json_uint(d, &v) != 0) {
            fail(p, SF_ST_E_BAD_SHAPE, "tensor \"%s\": shape[%d] is not a non-negative integer", qn, nd);
            return -1;
        }
        if (nd >= max_ndim) {
            fail(p, SF_ST_E_BAD_SHAPE, "tensor \"%s\" has more than %d dimensions", qn, max_ndim);
            return -1;
        }
        t->shape[nd] = (int64_t)v;
    }
    t->ndim = nd;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) {
        fail(p, SF_ST_E_BAD_OFFSETS, "tensor \"%s\": data_offsets is not an array of two integers", qn);
        return -1;
    }
    if (json_uint(offs->child, &t->begin) != 0 || json_uint(offs->child->next, &t->end) != 0) {
        fail(p, SF_ST_E_BAD_OFFSETS,
             "tensor \"%s\": data_offsets are not integers in [0, 2^53]", qn);
        return -1;
    }
    if (t->begin > t->end) {
        fail(p, SF_ST_E_BAD_OFFSETS, "tensor \"%s\": data_offsets [%llu, %llu] begin after they end",
             qn, (unsigned long long)t->begin, (unsigned long long)t->end);
        return -1;
    }
    return 0;
}

/* a * b, or UINT64_MAX on overflow. */
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    if (a != 0 && b > UINT64_MAX / a) return UINT64_MAX;
    return a * b;
}

static int check_size(sf_st_parser *p, const tensor *t, uint64_t *bytes)
{
    uint64_t n = (uint64_t)sf_st_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) n = mul_sat(n, (uint64_t)t->shape[i]);
    uint64_t have = t->end - t->begin;
    if (n != have) {
        char qn[64];
        fail(p, SF_ST_E_SHAPE_SIZE_MISMATCH,
             "tensor \"%s\": shape and dtype %s need %llu bytes but data_offsets [%llu, %llu] hold %llu",
             quote(qn, sizeof qn, t->name), sf_st_dtype_name(t->dtype), (unsigned long long)n,
             (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)have);
        return -1;
    }
    *bytes = n;
    return 0;
}

static int in_134(int64_t c) { return c == 1 || c == 3 || c == 4; }

static uint64_t align64(uint64_t v) { return (v + SF_ST_LABEL_ALIGN - 1) / SF_ST_LABEL_ALIGN * SF_ST_LABEL_ALIGN; }

static int cmp_begin(const void *a, const void *b)
{
    const tensor *x = *(const tensor *const *)a, *y = *(const tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The encoded form: "files" U8 [total], "files_offsets" I64 [n+1] (or their
 * aliases "jpeg", "jpeg_offsets"), "labels" [n] (labels may be absent where
 * not required). Fills p->info. */
static int validate_jpeg_form(sf_st_parser *p, const cJSON *jpg, const cJSON *joff, const cJSON *lab)
{
    const char *fname = jpg->string, *oname = joff->string;
    sf_st_info *in = &p->info;
    tensor tj, to, tl;
    memset(&tj, 0, sizeof tj);
    memset(&to, 0, sizeof to);
    memset(&tl, 0, sizeof tl);
    if (p->lim.jpeg_off) {
        /* Refused from the header, before a byte of the body is kept: the
         * service holds no decode buffers to decode it with. */
        fail(p, SF_ST_E_JPEG_BATCH_TOO_LARGE,
             "JPEG batches are off on this service (jpeg.max_batch_pixels is 0): send decoded \"images\"");
        return -1;
    }
    if (parse_tensor(p, jpg, &tj, 4) != 0 || parse_tensor(p, joff, &to, 4) != 0) return -1;
    if (tj.dtype != SF_ST_U8 || tj.ndim != 1) {
        fail(p, tj.dtype != SF_ST_U8 ? SF_ST_E_UNSUPPORTED_DTYPE : SF_ST_E_BAD_SHAPE,
             "tensor \"%s\" is %s with %d dimensions; it must be U8 [total_bytes]", fname,
             sf_st_dtype_name(tj.dtype), tj.ndim);
        return -1;
    }
    if (to.dtype != SF_ST_I64 || to.ndim != 1) {
        fail(p, to.dtype != SF_ST_I64 ? SF_ST_E_UNSUPPORTED_DTYPE : SF_ST_E_BAD_SHAPE,
             "tensor \"%s\" is %s with %d dimensions; it must be I64 [N+1]", oname,
             sf_st_dtype_name(to.dtype), to.ndim);
        return -1;
    }
    int64_t n = to.shape[0] - 1;
    if (n < 1) {
        fail(p, SF_ST_E_BAD_SHAPE, "tensor \"%s\" has shape [%lld]; a batch of N files needs [N+1], N >= 1",
             oname, (long long)to.shape[0]);
        return -1;
    }
    if (n > p->lim.max_n) {
        fail(p, SF_ST_E_BATCH_TOO_LARGE, "tensor \"%s\" describes %lld samples; the limit is %d", oname,
             (long long)n, p->lim.max_n);
        return -1;
    }
    if (tj.shape[0] < n) {
        fail(p, SF_ST_E_BAD_SHAPE, "tensor \"%s\" holds %lld bytes for %lld files; every file is at least 1 byte",
             fname, (long long)tj.shape[0], (long long)n);
        return -1;
    }
    uint64_t jpeg_bytes, off_bytes, labels_bytes = 0;
    if (check_size(p, &tj, &jpeg_bytes) != 0 || check_size(p, &to, &off_bytes) != 0) return -1;
    if (lab) {
        if (parse_tensor(p, lab, &tl, 4) != 0) return -1;
        if (tl.dtype != SF_ST_U8 && tl.dtype != SF_ST_I32 && tl.dtype != SF_ST_I64) {
            fail(p, SF_ST_E_UNSUPPORTED_DTYPE, "tensor \"labels\": dtype is %s; labels must be U8, I32 or I64",
                 sf_st_dtype_name(tl.dtype));
            return -1;
        }
        if (tl.ndim != 1) {
            fail(p, SF_ST_E_BAD_SHAPE,
                 "tensor \"labels\" has %d dimensions; with \"%s\" it must be [N] (class labels)", tl.ndim, fname);
            return -1;
        }
        if (tl.shape[0] != n) {
            fail(p, SF_ST_E_LABEL_COUNT_MISMATCH, "tensor \"labels\" holds %lld labels for %lld files",
                 (long long)tl.shape[0], (long long)n);
            return -1;
        }
        if (check_size(p, &tl, &labels_bytes) != 0) return -1;
    }

    /* data_offsets: the tensors tile the data section from 0, in any order. */
    const tensor *order[3] = {&tj, &to, lab ? &tl : NULL};
    int nt = lab ? 3 : 2;
    qsort(order, (size_t)nt, sizeof order[0], cmp_begin);
    uint64_t at = 0;
    for (int i = 0; i < nt; i++) {
        if (order[i]->begin < at) {
            fail(p, SF_ST_E_OFFSETS_OVERLAP, "data_offsets of \"%s\" [%llu, %llu] overlap the tensor before it",
                 order[i]->name, (unsigned long long)order[i]->begin, (unsigned long long)order[i]->end);
            return -1;
        }
        if (order[i]->begin != at) {
            fail(p, SF_ST_E_DATA_NOT_CONTIGUOUS,
                 "data_offsets of \"%s\" [%llu, %llu] leave a hole in the data section at byte %llu",
                 order[i]->name, (unsigned long long)order[i]->begin, (unsigned long long)order[i]->end,
                 (unsigned long long)at);
            return -1;
        }
        at = order[i]->end;
    }
    uint64_t body_len = 8 + in->header_len + at;
    if (body_len > p->lim.max_body_bytes) {
        fail(p, SF_ST_E_BODY_TOO_LARGE, "the body declares %llu bytes; the limit is %llu",
             (unsigned long long)body_len, (unsigned long long)p->lim.max_body_bytes);
        return -1;
    }
    in->n = (int)n;
    in->h = in->w = 0;
    in->c = 3;
    in->nhwc = 1;
    in->has_labels = lab != NULL;
    in->label_dtype = lab ? tl.dtype : SF_ST_U8;
    in->label_ndim = lab ? 1 : 0;
    in->label_shape[0] = lab ? n : 0;
    in->data_len = at;
    in->body_len = body_len;
    in->images_bytes = jpeg_bytes;
    in->labels_bytes = labels_bytes;
    in->labels_dest_off = lab ? align64(jpeg_bytes) : 0;
    in->encoded = 1;
    in->files_name = strcmp(fname, "jpeg") == 0 ? "jpeg" : "files";
    in->offsets_name = strcmp(oname, "jpeg_offsets") == 0 ? "jpeg_offsets" : "files_offsets";
    in->jpeg_offsets_dest_off = align64(lab ? in->labels_dest_off + labels_bytes : jpeg_bytes);
    in->jpeg_info_dest_off = align64(in->jpeg_offsets_dest_off + off_bytes);
    in->dest_bytes = in->jpeg_info_dest_off + (uint64_t)n * sizeof(sf_jpeg_info);
    p->images_begin = tj.begin;
    p->labels_begin = tl.begin;
    p->offsets_begin = to.begin;
    return 0;
}

/* The top-level keys of a header, each role at most once. */
typedef struct header_keys {
    const cJSON *img, *lab, *meta, *files, *offs;
} header_keys;

/* The encoded tensors' names: the format-neutral one first, then its alias. */
static const char *const FILES_NAMES[2] = {"files", "jpeg"};
static const char *const OFFSETS_NAMES[2] = {"files_offsets", "jpeg_offsets"};

static int is_one_of(const char *s, const char *const names[2])
{
    return strcmp(s, names[0]) == 0 || strcmp(s, names[1]) == 0;
}

/* Sorts the header's keys into their roles: a key of no role, or a role
 * named twice (also under both of its names), fails. */
static int find_keys(sf_st_parser *p, const cJSON *root, header_keys *k)
{
    char qn[64];
    memset(k, 0, sizeof *k);
    for (const cJSON *it = root->child; it; it = it->next) {
        const cJSON **slot;
        if (strcmp(it->string, "images") == 0) slot = &k->img;
        else if (strcmp(it->string, "labels") == 0) slot = &k->lab;
        else if (strcmp(it->string, "__metadata__") == 0) slot = &k->meta;
        else if (is_one_of(it->string, FILES_NAMES)) slot = &k->files;
        else if (is_one_of(it->string, OFFSETS_NAMES)) slot = &k->offs;
        else {
            fail(p, SF_ST_E_UNKNOWN_TENSOR,
                 "the header names the tensor \"%s\"; only \"images\" or \"files\" with \"files_offsets\" "
                 "(or their aliases \"jpeg\" and \"jpeg_offsets\"), and \"labels\" are accepted",
                 quote(qn, sizeof qn, it->string));
            return -1;
        }
        if (*slot) {
            if (strcmp((*slot)->string, it->string) == 0)
                fail(p, SF_ST_E_DUPLICATE_KEY, "the header names \"%s\" twice", it->string);
            else
                fail(p, SF_ST_E_DUPLICATE_KEY, "the header names \"%s\" and its alias \"%s\"; a body uses one",
                     (*slot)->string, it->string);
            return -1;
        }
        *slot = it;
    }
    return 0;
}

/* __metadata__ (may be NULL): an object of strings; "layout" is NHWC or NCHW.
 * *layout: 1 NHWC, 0 NCHW, -1 unspecified. */
static int parse_metadata(sf_st_parser *p, const cJSON *meta, int *layout)
{
    char qn[64], qv[64];
    *layout = -1;
    if (meta) {
        if (!cJSON_IsObject(meta)) {
            fail(p, SF_ST_E_BAD_METADATA, "__metadata__ is not a JSON object");
            return -1;
        }
        const cJSON *lay = NULL;
        for (const cJSON *m = meta->child; m; m = m->next) {
            if (!cJSON_IsString(m)) {
                fail(p, SF_ST_E_BAD_METADATA, "__metadata__.%s is not a string",
                     quote(qn, sizeof qn, m->string));
                return -1;
            }
            if (strcmp(m->string, "layout") == 0) {
                if (lay) {
                    fail(p, SF_ST_E_DUPLICATE_KEY, "__metadata__ names \"layout\" twice");
                    return -1;
                }
                lay = m;
            }
        }
        if (lay) {
            if (strcmp(lay->valuestring, "NHWC") == 0) *layout = 1;
            else if (strcmp(lay->valuestring, "NCHW") == 0) *layout = 0;
            else {
                fail(p, SF_ST_E_BAD_LAYOUT, "__metadata__.layout is \"%s\"; it must be \"NHWC\" or \"NCHW\"",
                     quote(qv, sizeof qv, lay->valuestring));
                return -1;
            }
        }
    }

    return 0;
}

/* The pixel form: "images" U8 [N,H,W,C] or [N,C,H,W], "labels" (may be
 * NULL where not required). Fills p->info. */
static int validate_pixel_form(sf_st_parser *p, const cJSON *img, const cJSON *lab, int layout)
{
    sf_st_info *in = &p->info;
    /* images */
    tensor ti, tl;
    memset(&ti, 0, sizeof ti);
    memset(&tl, 0, sizeof tl);
    if (parse_tensor(p, img, &ti, 4) != 0) return -1;
    if (ti.dtype != SF_ST_U8) {
        fail(p, SF_ST_E_UNSUPPORTED_DTYPE, "tensor \"images\": dtype is %s; images must be U8",
             sf_st_dtype_name(ti.dtype));
        return -1;
    }
    if (ti.ndim != 4) {
        fail(p, SF_ST_E_BAD_SHAPE, "tensor \"images\" has %d dimensions; it must have 4 ([N,H,W,C] or [N,C,H,W])",
             ti.ndim);
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        if (ti.shape[i] == 0) {
            fail(p, SF_ST_E_BAD_SHAPE, "tensor \"images\": shape[%d] is 0", i);
            return -1;
        }
    }
    if (layout < 0) {
        if (in_134(ti.shape[3])) layout = 1;
        else if (in_134(ti.shape[1])) layout = 0;
        else {
            fail(p, SF_ST_E_BAD_LAYOUT,
                 "tensor \"images\" has shape [%lld,%lld,%lld,%lld]: neither dimension 3 (NHWC) nor dimension 1 (NCHW) is a channel count 1, 3 or 4, and __metadata__.layout is not given",
                 (long long)ti.shape[0], (long long)ti.shape[1], (long long)ti.shape[2], (long long)ti.shape[3]);
            return -1;
        }
    }
    int64_t n = ti.shape[0], c, h, w;
    if (layout == 1) { h = ti.shape[1]; w = ti.shape[2]; c = ti.shape[3]; }
    else { c = ti.shape[1]; h = ti.shape[2]; w = ti.shape[3]; }
    if (!in_134(c)) {
        fail(p, SF_ST_E_BAD_SHAPE, "tensor \"images\" (%s) has %lld channels; it must have 1, 3 or 4",
             layout ? "NHWC" : "NCHW", (long long)c);
        return -1;
    }
    if (n > p->lim.max_n) {
        fail(p, SF_ST_E_BATCH_TOO_LARGE, "tensor \"images\" holds %lld samples; the limit is %d",
             (long long)n, p->lim.max_n);
        return -1;
    }
    if (h > p->lim.max_h || w > p->lim.max_w) {
        fail(p, SF_ST_E_IMAGE_TOO_LARGE, "tensor \"images\" has images of %lldx%lld (HxW); the limit is %dx%d",
             (long long)h, (long long)w, p->lim.max_h, p->lim.max_w);
        return -1;
    }
    uint64_t images_bytes;
    if (check_size(p, &ti, &images_bytes) != 0) return -1;

    /* labels */
    uint64_t labels_bytes = 0;
    if (lab) {
        if (parse_tensor(p, lab, &tl, 4) != 0) return -1;
        if (tl.dtype != SF_ST_U8 && tl.dtype != SF_ST_I32 && tl.dtype != SF_ST_I64) {
            fail(p, SF_ST_E_UNSUPPORTED_DTYPE, "tensor \"labels\": dtype is %s; labels must be U8, I32 or I64",
                 sf_st_dtype_name(tl.dtype));
            return -1;
        }
        if (tl.ndim != 1 && tl.ndim != 3) {
            fail(p, SF_ST_E_BAD_SHAPE, "tensor \"labels\" has %d dimensions; it must be [N] or [N,H,W]", tl.ndim);
            return -1;
        }
        if (tl.shape[0] != n) {
            fail(p, SF_ST_E_LABEL_COUNT_MISMATCH, "tensor \"labels\" holds %lld labels for %lld images",
                 (long long)tl.shape[0], (long long)n);
            return -1;
        }
        if (tl.ndim == 3 && (tl.shape[1] != h || tl.shape[2] != w)) {
            fail(p, SF_ST_E_BAD_SHAPE, "tensor \"labels\" has masks of %lldx%lld (HxW) for images of %lldx%lld",
                 (long long)tl.shape[1], (long long)tl.shape[2], (long long)h, (long long)w);
            return -1;
        }
        if (check_size(p, &tl, &labels_bytes) != 0) return -1;
    }

    /* data_offsets: no overlap, contiguous from 0, covering the section */
    uint64_t data_len = ti.end;
    if (lab) {
        if (ti.begin < tl.end && tl.begin < ti.end) {
            fail(p, SF_ST_E_OFFSETS_OVERLAP, "data_offsets of \"images\" [%llu, %llu] and \"labels\" [%llu, %llu] overlap",
                 (unsigned long long)ti.begin, (unsigned long long)ti.end,
                 (unsigned long long)tl.begin, (unsigned long long)tl.end);
            return -1;
        }
        const tensor *first = ti.begin <= tl.begin ? &ti : &tl;
        const tensor *second = first == &ti ? &tl : &ti;
        if (first->begin != 0 || second->begin != first->end) {
            fail(p, SF_ST_E_DATA_NOT_CONTIGUOUS,
                 "data_offsets of \"images\" [%llu, %llu] and \"labels\" [%llu, %llu] do not cover the data section from 0 without a hole",
                 (unsigned long long)ti.begin, (unsigned long long)ti.end,
                 (unsigned long long)tl.begin, (unsigned long long)tl.end);
            return -1;
        }
        data_len = second->end;
    } else if (ti.begin != 0) {
        fail(p, SF_ST_E_DATA_NOT_CONTIGUOUS, "data_offsets of \"images\" [%llu, %llu] do not start at 0",
             (unsigned long long)ti.begin, (unsigned long long)ti.end);
        return -1;
    }

    uint64_t body_len = 8 + in->header_len + data_len; /* each term < 2^54: no overflow */
    if (body_len > p->lim.max_body_bytes) {
        fail(p, SF_ST_E_BODY_TOO_LARGE, "the body declares %llu bytes; the limit is %llu",
             (unsigned long long)body_len, (unsigned long long)p->lim.max_body_bytes);
        return -1;
    }

    in->n = (int)n;
    in->h = (int)h;
    in->w = (int)w;
    in->c = (int)c;
    in->nhwc = layout;
    in->has_labels = lab != NULL;
    in->label_dtype = lab ? tl.dtype : SF_ST_U8;
    in->label_ndim = lab ? tl.ndim : 0;
    for (int i = 0; i < 3; i++) in->label_shape[i] = (lab && i < tl.ndim) ? tl.shape[i] : 0;
    in->data_len = data_len;
    in->body_len = body_len;
    in->images_bytes = images_bytes;
    in->labels_bytes = labels_bytes;
    in->labels_dest_off = lab ? (images_bytes + SF_ST_LABEL_ALIGN - 1) / SF_ST_LABEL_ALIGN * SF_ST_LABEL_ALIGN : 0;
    in->dest_bytes = lab ? in->labels_dest_off + labels_bytes : images_bytes;
    p->images_begin = ti.begin;
    p->labels_begin = tl.begin;
    return 0;
}


/* Everything about the header; fills p->info. Returns 0 or -1 (failed). */
static int validate_header(sf_st_parser *p, const cJSON *root)
{
    if (!cJSON_IsObject(root)) {
        fail(p, SF_ST_E_HEADER_NOT_OBJECT, "the header JSON is not an object");
        return -1;
    }
    header_keys k;
    int layout;
    if (find_keys(p, root, &k) != 0 || parse_metadata(p, k.meta, &layout) != 0) return -1;
    if (k.img && (k.files || k.offs)) {
        fail(p, SF_ST_E_BAD_TENSOR,
             "the header names \"images\" and \"%s\"; a body carries pixels or encoded files, not both",
             (k.files ? k.files : k.offs)->string);
        return -1;
    }
    if (k.files || k.offs) {
        if (!k.files || !k.offs) {
            fail(p, SF_ST_E_BAD_TENSOR, "the header names \"%s\" without \"%s\"",
                 k.files ? k.files->string : k.offs->string, k.files ? "files_offsets" : "files");
            return -1;
        }
        if (!k.lab && p->lim.labels_required) {
            fail(p, SF_ST_E_MISSING_LABELS, "the header has no tensor \"labels\"");
            return -1;
        }
        return validate_jpeg_form(p, k.files, k.offs, k.lab);
    }
    if (!k.img) {
        fail(p, SF_ST_E_MISSING_IMAGES, "the header has no tensor \"images\" (nor \"files\")");
        return -1;
    }
    if (!k.lab && p->lim.labels_required) {
        fail(p, SF_ST_E_MISSING_LABELS, "the header has no tensor \"labels\"");
        return -1;
    }
    return validate_pixel_form(p, k.img, k.lab, layout);
}

/* The complete header as JSON: balanced (the raw scan saw it all), UTF-8, one
 * JSON value and only white space after it. NULL after a failure. */
static cJSON *parse_header_json(sf_st_parser *p, const char *hdr, uint64_t len)
{
    if (p->scan_in_str || p->scan_depth != 0) {
        fail(p, SF_ST_E_HEADER_NOT_JSON, "the header is not valid JSON (unbalanced brackets or an unterminated string)");
        return NULL;
    }
    size_t bad = sf_utf8_valid_prefix((const unsigned char *)hdr, (size_t)len);
    if (bad != len) {
        fail(p, SF_ST_E_HEADER_NOT_JSON, "the header is not valid UTF-8 (at byte %zu)", bad);
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)len, &end, 0);
    if (!root) {
        fail(p, SF_ST_E_HEADER_NOT_JSON, "the header is not valid JSON");
        return NULL;
    }
    for (const char *q = end; q < hdr + len; q++) {
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            fail(p, SF_ST_E_HEADER_NOT_JSON, "the header has bytes after its JSON value (at byte %zu)",
                 (size_t)(q - hdr));
            cJSON_Delete(root);
            return NULL;
        }
    }
    return root;
}

static void header_complete(sf_st_parser *p)
{
    uint64_t len = p->info.header_len;
    p->hdr[len] = '\0';
    cJSON *root = parse_header_json(p, p->hdr, len);
    if (!root)
        return;
    int rc = validate_header(p, root);
    cJSON_Delete(root);
    /* The raw header is no longer needed: give the memory back early. */
    free(p->hdr);
    p->hdr = NULL;
    if (rc == 0) {
        p->have_info = 1;
        p->state = SF_ST_NEED_DEST;
    }
}

static void length_complete(sf_st_parser *p)
{
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | p->len_buf[i];
    p->info.header_len = hl;
    if (hl < 2) {
        fail(p, SF_ST_E_HEADER_LENGTH_INVALID,
             "the header length is %llu; a header is a JSON object of at least 2 bytes",
             (unsigned long long)hl);
        return;
    }
    if (hl > p->lim.max_header_bytes) {
        fail(p, SF_ST_E_HEADER_TOO_LARGE, "the header length is %llu bytes; the limit is %llu",
             (unsigned long long)hl, (unsigned long long)p->lim.max_header_bytes);
        return;
    }
    if (hl > p->lim.max_body_bytes - 8 || p->lim.max_body_bytes < 8) {
        fail(p, SF_ST_E_BODY_TOO_LARGE, "the header alone (%llu bytes) exceeds the body limit of %llu bytes",
             (unsigned long long)hl, (unsigned long long)p->lim.max_body_bytes);
        return;
    }
    p->hdr = malloc((size_t)hl + 1);
    if (!p->hdr) {
        fail(p, SF_ST_E_OUT_OF_MEMORY, "no memory for a header of %llu bytes", (unsigned long long)hl);
        return;
    }
}

/* ---- data ----------------------------------------------------------------- */

static void copy_part(uint8_t *dst, uint64_t t_begin, uint64_t t_len,
                      const uint8_t *src, uint64_t pos, uint64_t len)
{
    uint64_t lo = pos > t_begin ? pos : t_begin;
    uint64_t hi = pos + len < t_begin + t_len ? pos + len : t_begin + t_len;
    if (lo < hi) memcpy(dst + (lo - t_begin), src + (lo - pos), (size_t)(hi - lo));
}

static void check_labels(sf_st_parser *p)
{
    const sf_st_info *in = &p->info;
    if (p->lim.classes <= 0) return;
    const uint8_t *b = p->dest + in->labels_dest_off;
    int sz = sf_st_dtype_size(in->label_dtype);
    uint64_t count = in->labels_bytes / (uint64_t)sz;
    int64_t classes = p->lim.classes;
    for (uint64_t i = 0; i < count; i++) {
        int64_t v;
        const uint8_t *e = b + i * (uint64_t)sz;
        if (sz == 1) {
            v = e[0];
        } else if (sz == 4) {
            uint32_t u = (uint32_t)e[0] | (uint32_t)e[1] << 8 | (uint32_t)e[2] << 16 | (uint32_t)e[3] << 24;
            v = (int32_t)u;
        } else {
            uint64_t u = 0;
            for (int k = 7; k >= 0; k--) u = (u << 8) | e[k];
            v = (int64_t)u;
        }
        if (v < 0 || v >= classes) {
            p->bad_label_index = (int64_t)i;
            p->bad_label_value = v;
            fail(p, SF_ST_E_LABEL_OUT_OF_RANGE,
                 "tensor \"labels\": element %llu is %lld; labels must lie in [0, %d)",
                 (unsigned long long)i, (long long)v, p->lim.classes);
            return;
        }
    }
}

static int64_t load_i64(const uint8_t *b)
{
    uint64_t u = 0;
    for (int k = 7; k >= 0; k--) u = (u << 8) | b[k];
    return (int64_t)u;
}

/* The encoded form, after each chunk: the offsets once they are complete,
 * then the header of every file whose last byte has arrived. */
static void check_jpeg(sf_st_parser *p)
{
    sf_st_info *in = &p->info;
    const uint8_t *ob = p->dest + in->jpeg_offsets_dest_off;
    if (!p->offsets_checked) {
        if (p->data_have < p->offsets_begin + (uint64_t)(in->n + 1) * 8) return;
        p->offsets_checked = 1;
        int64_t prev = load_i64(ob);
        if (prev != 0) {
            fail(p, SF_ST_E_JPEG_OFFSETS_INVALID, "tensor \"%s\": element 0 is %lld; it must be 0",
                 in->offsets_name, (long long)prev);
            return;
        }
        for (int i = 1; i <= in->n; i++) {
            int64_t v = load_i64(ob + 8 * (size_t)i);
            if (v <= prev) {
                fail(p, SF_ST_E_JPEG_OFFSETS_INVALID,
                     "tensor \"%s\": element %d is %lld, not above element %d (%lld); every file is non-empty",
                     in->offsets_name, i, (long long)v, i - 1, (long long)prev);
                return;
            }
            prev = v;
        }
        if ((uint64_t)prev != in->images_bytes) {
            fail(p, SF_ST_E_JPEG_OFFSETS_INVALID,
                 "tensor \"%s\": the last element is %lld but \"%s\" holds %llu bytes", in->offsets_name,
                 (long long)prev, in->files_name, (unsigned long long)in->images_bytes);
            return;
        }
    }
    sf_jpeg_limits jl = {p->lim.jpeg_max_side, p->lim.jpeg_max_pixels};
    sf_jpeg_info *infos = (sf_jpeg_info *)(void *)(p->dest + in->jpeg_info_dest_off);
    while (p->jpeg_next < in->n) {
        int i = p->jpeg_next;
        uint64_t b = (uint64_t)load_i64(ob + 8 * (size_t)i), e = (uint64_t)load_i64(ob + 8 * (size_t)(i + 1));
        if (p->data_have < p->images_begin + e) return;
        char msg[SF_JPEG_MSG_CAP];
        sf_jpeg_info ji;
        sf_jpeg_error je = sf_image_header_parse(p->dest + b, (size_t)(e - b), &jl, &ji, msg, sizeof msg);
        if (je != SF_JPEG_OK) {
            p->bad_sample = i;
            fail(p, (sf_st_error)(SF_ST_E_JPEG_NOT_JPEG + (je - SF_JPEG_E_NOT_JPEG)), "sample %d of \"%s\": %s", i,
                 in->files_name, msg);
            return;
        }
        int64_t px = (int64_t)ji.h * ji.w;
        if (p->lim.jpeg_max_batch_pixels > 0 && in->jpeg_pixels + px > p->lim.jpeg_max_batch_pixels) {
            p->bad_sample = i;
            fail(p, SF_ST_E_JPEG_BATCH_TOO_LARGE,
                 "sample %d of \"%s\" (%dx%d) brings the batch to %lld decoded pixels; jpeg.max_batch_pixels is %lld",
                 i, in->files_name, ji.h, ji.w, (long long)(in->jpeg_pixels + px), (long long)p->lim.jpeg_max_batch_pixels);
            return;
        }
        in->jpeg_pixels += px;
        if (ji.h > in->jpeg_max_h) in->jpeg_max_h = ji.h;
        if (ji.w > in->jpeg_max_w) in->jpeg_max_w = ji.w;
        memcpy(&infos[i], &ji, sizeof ji);
        p->jpeg_next++;
    }
}

static size_t feed_data(sf_st_parser *p, const uint8_t *data, size_t len)
{
    const sf_st_info *in = &p->info;
    uint64_t remaining = in->data_len - p->data_have;
    /* Bytes up to the declared end are copied (and the labels checked) before
     * an overlong chunk fails, so the outcome does not depend on chunking. */
    size_t take = (uint64_t)len > remaining ? (size_t)remaining : len;
    uint64_t pos = p->data_have;
    if (take > 0) {
        copy_part(p->dest, p->images_begin, in->images_bytes, data, pos, take);
        if (in->has_labels)
            copy_part(p->dest + in->labels_dest_off, p->labels_begin, in->labels_bytes, data, pos, take);
        if (in->encoded)
            copy_part(p->dest + in->jpeg_offsets_dest_off, p->offsets_begin, (uint64_t)(in->n + 1) * 8, data,
                      pos, take);
        p->data_have += take;
        if (in->has_labels && !p->labels_checked && p->data_have >= p->labels_begin + in->labels_bytes) {
            p->labels_checked = 1;
            check_labels(p);
        }
        if (in->encoded && p->state != SF_ST_FAILED)
            check_jpeg(p);
        if (p->state == SF_ST_DATA && p->data_have == in->data_len) p->state = SF_ST_COMPLETE;
    }
    if (take < len)
        fail(p, SF_ST_E_BODY_TOO_LONG,
             "the body is longer than the %llu bytes its header declares (8 + %llu header + %llu data)",
             (unsigned long long)in->body_len, (unsigned long long)in->header_len,
             (unsigned long long)in->data_len);
    return take;
}

size_t sf_st_feed(sf_st_parser *p, const uint8_t *data, size_t len)
{
    if (len == 0) return 0;
    switch (p->state) {
    case SF_ST_NEED_DEST:
    case SF_ST_FAILED:
        return 0;
    case SF_ST_DATA:
        return feed_data(p, data, len);
    case SF_ST_COMPLETE:
        return feed_data(p, data, len); /* fails with body_too_long */
    case SF_ST_HEADER:
        break;
    }
    size_t used = 0;
    while (used < len && p->state == SF_ST_HEADER) {
        if (p->len_have < 8) {
            size_t take = 8 - p->len_have;
            if (take > len - used) take = len - used;
            memcpy(p->len_buf + p->len_have, data + used, take);
            p->len_have += (unsigned)take;
            used += take;
            if (p->len_have == 8) length_complete(p);
            continue;
        }
        uint64_t want = p->info.header_len - p->hdr_have;
        size_t take = (uint64_t)(len - used) < want ? len - used : (size_t)want;
        size_t k = 0;
        for (; k < take && p->state == SF_ST_HEADER; k++)
            scan_byte(p, data[used + k], p->hdr_have + k);
        memcpy(p->hdr + p->hdr_have, data + used, k);
        p->hdr_have += k;
        used += k;
        if (p->state == SF_ST_HEADER && p->hdr_have == p->info.header_len) header_complete(p);
    }
    return used;
}

void sf_st_set_dest(sf_st_parser *p, uint8_t *dest, size_t cap)
{
    if (p->state != SF_ST_NEED_DEST) {
        fail(p, SF_ST_E_BAD_CALL, "sf_st_set_dest called in state %s", state_name(p->state));
        return;
    }
    if (!dest || (uint64_t)cap < p->info.dest_bytes) {
        fail(p, SF_ST_E_SLOT_TOO_SMALL, "the batch needs %llu bytes but the slot holds %zu",
             (unsigned long long)p->info.dest_bytes, dest ? cap : (size_t)0);
        return;
    }
    p->dest = dest;
    p->dest_cap = cap;
    p->state = SF_ST_DATA;
}

int sf_st_finish(sf_st_parser *p)
{
    switch (p->state) {
    case SF_ST_COMPLETE:
        return 0;
    case SF_ST_FAILED:
        return -1;
    case SF_ST_HEADER:
        if (p->len_have < 8)
            fail(p, SF_ST_E_BODY_TOO_SHORT, "the body ended after %u of the 8 header-length bytes", p->len_have);
        else
            fail(p, SF_ST_E_BODY_TOO_SHORT, "the body ended after %llu of the %llu header bytes",
                 (unsigned long long)p->hdr_have, (unsigned long long)p->info.header_len);
        return -1;
    case SF_ST_NEED_DEST:
    case SF_ST_DATA:
        fail(p, SF_ST_E_BODY_TOO_SHORT, "the body ended after %llu of its %llu bytes",
             (unsigned long long)(8 + p->info.header_len + p->data_have),
             (unsigned long long)p->info.body_len);
        return -1;
    }
    return -1;
}

/* ---- whole files ---------------------------------------------------------- */

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp((*(const tensor *const *)a)->name, (*(const tensor *const *)b)->name);
}

static int cmp_entry_begin(const void *a, const void *b)
{
    const tensor *x = *(const tensor *const *)a, *y = *(const tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The entries of a parsed header, checked against each other and the data
 * section: no name twice, and the data_offsets tile [0, data_len) exactly. */
static int index_entries(sf_st_parser *p, sf_st_file *f, const cJSON *root, int max_tensors)
{
    char qn[64];
    int count = 0;
    for (const cJSON *it = root->child; it; it = it->next) count++;
    if (count > max_tensors + 1) {
        fail(p, SF_ST_E_BAD_TENSOR, "the header lists %d entries; at most %d are read", count, max_tensors);
        return -1;
    }
    f->tensors = calloc((size_t)count + 1, sizeof *f->tensors);
    tensor **order = calloc((size_t)count + 1, sizeof *order);
    int rc = -1;
    if (!f->tensors || !order) {
        fail(p, SF_ST_E_OUT_OF_MEMORY, "no memory to index %d header entries", count);
        goto out;
    }
    for (const cJSON *it = root->child; it; it = it->next) {
        if (!it->string[0]) {
            fail(p, SF_ST_E_BAD_TENSOR, "a tensor has an empty name");
            goto out;
        }
        if (strcmp(it->string, "__metadata__") == 0) {
            if (f->meta_) {
                fail(p, SF_ST_E_DUPLICATE_KEY, "the header names \"__metadata__\" twice");
                goto out;
            }
            if (!cJSON_IsObject(it)) {
                fail(p, SF_ST_E_BAD_METADATA, "__metadata__ is not a JSON object");
                goto out;
            }
            for (const cJSON *m = it->child; m; m = m->next)
                if (!cJSON_IsString(m)) {
                    fail(p, SF_ST_E_BAD_METADATA, "__metadata__.%s is not a string",
                         quote(qn, sizeof qn, m->string));
                    goto out;
                }
            f->meta_ = (void *)it;
            continue;
        }
        tensor *t = &f->tensors[f->n];
        uint64_t bytes;
        if (parse_tensor(p, it, t, 8) != 0 || check_size(p, t, &bytes) != 0)
            goto out;
        order[f->n++] = t;
    }
    qsort(order, (size_t)f->n, sizeof *order, cmp_entry_name);
    for (int i = 1; i < f->n; i++)
        if (strcmp(order[i]->name, order[i - 1]->name) == 0) {
            fail(p, SF_ST_E_DUPLICATE_KEY, "the header names the tensor \"%s\" twice",
                 quote(qn, sizeof qn, order[i]->name));
            goto out;
        }
    qsort(order, (size_t)f->n, sizeof *order, cmp_entry_begin);
    uint64_t at = 0;
    for (int i = 0; i < f->n; i++) {
        if (order[i]->begin != at) {
            fail(p, order[i]->begin < at ? SF_ST_E_OFFSETS_OVERLAP : SF_ST_E_DATA_NOT_CONTIGUOUS,
                 "tensor \"%s\": data_offsets [%llu, %llu] leave a hole or overlap at byte %llu",
                 quote(qn, sizeof qn, order[i]->name), (unsigned long long)order[i]->begin,
                 (unsigned long long)order[i]->end, (unsigned long long)at);
            goto out;
        }
        at = order[i]->end;
    }
    if (at != f->data_len) {
        fail(p, at < f->data_len ? SF_ST_E_BODY_TOO_LONG : SF_ST_E_BODY_TOO_SHORT,
             "the data section is %llu bytes but the tensors cover %llu",
             (unsigned long long)f->data_len, (unsigned long long)at);
        goto out;
    }
    rc = 0;
out:
    free(order);
    return rc;
}

int sf_st_file_read(sf_st_file *f, const uint8_t *buf, size_t len, uint64_t max_header_bytes,
                    int max_tensors)
{
    memset(f, 0, sizeof *f);
    sf_st_parser p;
    sf_st_limits lim = {.max_header_bytes = max_header_bytes, .max_body_bytes = UINT64_MAX};
    sf_st_init(&p, &lim);
    if (len < 8) {
        fail(&p, SF_ST_E_BODY_TOO_SHORT, "the file is %zu bytes: shorter than the 8-byte header length", len);
        goto failed;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | buf[i];
    if (n < 2) {
        fail(&p, SF_ST_E_HEADER_LENGTH_INVALID,
             "the header length is %llu; a header is a JSON object of at least 2 bytes", (unsigned long long)n);
        goto failed;
    }
    if (n > p.lim.max_header_bytes) {
        fail(&p, SF_ST_E_HEADER_TOO_LARGE, "the header length is %llu bytes; the limit is %llu",
             (unsigned long long)n, (unsigned long long)p.lim.max_header_bytes);
        goto failed;
    }
    if (n > len - 8) {
        fail(&p, SF_ST_E_BODY_TOO_SHORT, "the header length %llu does not fit the %zu-byte file",
             (unsigned long long)n, len);
        goto failed;
    }
    /* The same raw scan as for uploads: depth, control characters, \u0000. */
    const char *hdr = (const char *)buf + 8;
    for (uint64_t i = 0; i < n && p.state != SF_ST_FAILED; i++)
        scan_byte(&p, (unsigned char)hdr[i], i);
    if (p.state == SF_ST_FAILED)
        goto failed;
    cJSON *root = parse_header_json(&p, hdr, n);
    if (!root)
        goto failed;
    f->json_ = root;
    if (!cJSON_IsObject(root)) {
        fail(&p, SF_ST_E_HEADER_NOT_OBJECT, "the header JSON is not an object");
        goto failed;
    }
    f->data = buf + 8 + n;
    f->data_len = len - 8 - n;
    f->header_len = n;
    if (index_entries(&p, f, root, max_tensors) != 0)
        goto failed;
    return 0;
failed:
    sf_st_file_free(f);
    f->err = p.err;
    memcpy(f->msg, p.msg, sizeof f->msg);
    return -1;
}

const char *sf_st_file_meta(const sf_st_file *f, const char *key)
{
    const cJSON *v = f->meta_ ? cJSON_GetObjectItemCaseSensitive((const cJSON *)f->meta_, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

void sf_st_file_free(sf_st_file *f)
{
    cJSON_Delete(f->json_);
    free(f->tensors);
    f->json_ = NULL;
    f->meta_ = NULL;
    f->tensors = NULL;
    f->n = 0;
}

/* ---- writer --------------------------------------------------------------- */

typedef struct sink {
    char *buf;
    size_t cap, len;
} sink;

static void put(sink *s, const char *str, size_t n)
{
    if (s->buf && s->len + n <= s->cap) memcpy(s->buf + s->len, str, n);
    s->len += n;
}

static void puts_(sink *s, const char *str) { put(s, str, strlen(str)); }

static void put_u64(sink *s, uint64_t v)
{
    char b[24];
    int n = snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    put(s, b, (size_t)n);
}

static void put_jstr(sink *s, const char *str)
{
    static const char hex[] = "0123456789abcdef";
    put(s, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)str; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            put(s, e, 2);
        } else if (*c < 0x20) {
            char e[6] = {'\\', 'u', '0', '0', hex[*c >> 4], hex[*c & 15]};
            put(s, e, 6);
        } else {
            put(s, (const char *)c, 1);
        }
    }
    put(s, "\"", 1);
}

static int utf8_ok(const char *s)
{
    return sf_utf8_valid_prefix((const unsigned char *)s, strlen(s)) == strlen(s);
}

static int name_ok(const char *s)
{
    return s && s[0] && strcmp(s, "__metadata__") != 0 && utf8_ok(s);
}

size_t sf_st_header_build(char *buf, size_t cap, const sf_st_tensor_desc *t, int nt,
                          const char *metadata_json)
{
    if (nt < 0 || (nt > 0 && !t)) return 0;
    for (int i = 0; i < nt; i++) {
        if (!name_ok(t[i].name) || sf_st_dtype_name(t[i].dtype) == NULL || t[i].ndim < 0 || t[i].ndim > 8)
            return 0;
        for (int j = 0; j < i; j++)
            if (strcmp(t[i].name, t[j].name) == 0) return 0;
        for (int d = 0; d < t[i].ndim; d++)
            if (t[i].shape[d] < 0) return 0;
    }
    cJSON *meta = NULL;
    if (metadata_json) {
        meta = cJSON_Parse(metadata_json);
        if (!cJSON_IsObject(meta)) { cJSON_Delete(meta); return 0; }
        for (const cJSON *m = meta->child; m; m = m->next) {
            if (!cJSON_IsString(m) || !name_ok(m->string) || !utf8_ok(m->valuestring)) {
                cJSON_Delete(meta);
                return 0;
            }
        }
    }

    sink s = {buf, cap, 8}; /* the length goes first, once known */
    put(&s, "{", 1);
    int first = 1;
    if (meta) {
        puts_(&s, "\"__metadata__\":{");
        for (const cJSON *m = meta->child; m; m = m->next) {
            if (m != meta->child) put(&s, ",", 1);
            put_jstr(&s, m->string);
            put(&s, ":", 1);
            put_jstr(&s, m->valuestring);
        }
        put(&s, "}", 1);
        first = 0;
        cJSON_Delete(meta);
    }
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        uint64_t bytes = (uint64_t)sf_st_dtype_size(t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++) bytes = mul_sat(bytes, (uint64_t)t[i].shape[d]);
        if (bytes > MAX_JSON_INT || off + bytes > MAX_JSON_INT) return 0;
        if (!first) put(&s, ",", 1);
        first = 0;
        put_jstr(&s, t[i].name);
        puts_(&s, ":{\"dtype\":\"");
        puts_(&s, sf_st_dtype_name(t[i].dtype));
        puts_(&s, "\",\"shape\":[");
        for (int d = 0; d < t[i].ndim; d++) {
            if (d) put(&s, ",", 1);
            put_u64(&s, (uint64_t)t[i].shape[d]);
        }
        puts_(&s, "],\"data_offsets\":[");
        put_u64(&s, off);
        put(&s, ",", 1);
        put_u64(&s, off + bytes);
        puts_(&s, "]}");
        off += bytes;
    }
    put(&s, "}", 1);
    while (s.len % 8) put(&s, " ", 1);
    if (buf && s.len <= cap) {
        uint64_t hl = s.len - 8;
        for (int i = 0; i < 8; i++) buf[i] = (char)(uint8_t)(hl >> (8 * i));
    }
    return s.len;
}
