/* server/safetensors.h — incremental safetensors parser and header writer.
 *
 * What it is for. A loader POSTs a batch as a safetensors file (DESIGN.md §4):
 * an 8-byte little-endian header length, a JSON header naming the tensors
 * "images" and "labels" (and optionally "__metadata__"), then the raw data
 * section. The HTTP layer hands the body to this parser chunk by chunk as it
 * arrives. The parser validates the whole header as soon as the header has
 * arrived, before any data byte is read, and then copies every data byte
 * exactly once, straight into a destination buffer (a pinned ring slot) that the
 * caller supplies after the header was accepted. There is no staging buffer.
 *
 * Who calls what. The request handler owns one sf_st_parser per request. It
 * calls sf_st_init() with the limits from the configuration, then
 * sf_st_feed() with each body chunk. sf_st_feed() returns how many bytes it
 * consumed; it stops at the end of the header, where the state becomes
 * SF_ST_NEED_DEST. The handler then reads sf_st_info_of() (shape, layout,
 * byte counts, dest_bytes), obtains a ring slot of at least info.dest_bytes
 * bytes, passes it to sf_st_set_dest(), and feeds the rest of the chunk and the
 * following chunks. Images land at dest + 0 and labels at
 * dest + info.labels_dest_off (images_bytes rounded up to 64). When the body has
 * ended the handler calls sf_st_finish(), which reports a body that was too
 * short. A body that is too long is reported by sf_st_feed() as soon as the
 * first extra byte arrives. At any point the state may become SF_ST_FAILED;
 * sf_st_error_code() then gives a stable snake_case code (for the HTTP error
 * body and the batches_rejected_total{reason} counter) and
 * sf_st_error_message() a sentence naming the tensor, field and value. Finally
 * the handler calls sf_st_free() (or sf_st_reset() to reuse the parser).
 *
 * A typical feed loop looks like this:
 *
 *     while (len > 0 && sf_st_state_of(p) != SF_ST_FAILED) {
 *         size_t used = sf_st_feed(p, data, len);
 *         data += used; len -= used;
 *         if (sf_st_state_of(p) == SF_ST_NEED_DEST) {
 *             slot = ring_acquire(sf_st_info_of(p)->dest_bytes);
 *             sf_st_set_dest(p, slot->ptr, slot->cap);
 *         }
 *     }
 *
 * Label values are checked against the exclusive upper bound limits.classes
 * as soon as the last label byte has been copied, on the bytes in dest, so a bad
 * label fails the parse from sf_st_feed() (or is reported again by
 * sf_st_finish()); sf_st_bad_label_index() names the first offending element.
 *
 * The data section length is defined by the header (the largest end offset);
 * the parser does not know the Content-Length. A caller that knows it may
 * compare it with info.body_len once the header has been accepted.
 *
 * Threads and memory. A parser holds no global or shared state: use one parser
 * per request, from one thread at a time (the libmicrohttpd callbacks of one
 * connection are serialised). Different parsers may be used concurrently. The
 * parser struct is public so that it can live inside the request context
 * without an allocation; its only heap allocation is the header buffer, of
 * exactly the declared header length (at most limits.max_header_bytes), which
 * sf_st_reset() and sf_st_free() release. cJSON allocates while it parses the
 * header and frees before sf_st_feed() returns. One caveat lies outside this
 * file: cJSON 1.7 writes its process-wide error position (cJSON_GetErrorPtr) on
 * every parse, so concurrent parses race on that variable. The parser never
 * reads it and nothing else should rely on it; ThreadSanitizer reports it.
 *
 * The encoded ("files") form. Instead of "images" a body may carry "files",
 * U8 [total_bytes] (the n encoded image files concatenated, as they are on
 * disk: JPEG, PNG or WebP, each told apart by its first bytes), and
 * "files_offsets", I64 [n+1] (file i is files[off[i], off[i+1]); off[0] = 0,
 * off[n] = total_bytes, every file non-empty), with "labels" [n] as usual.
 * "jpeg" and "jpeg_offsets" are the same tensors' older names, accepted as
 * aliases (one name of each pair per body).
 * In dest the files land at dest + 0, the labels at labels_dest_off, the
 * offsets at jpeg_offsets_dest_off and one sf_jpeg_info per sample at
 * jpeg_info_dest_off (all 64-byte aligned). The offsets are checked once they
 * have arrived, and each file's header (server/jpeg_header.h) as soon as its
 * last byte has arrived (or, when the offsets come after the files in the
 * data section, as soon as the offsets have; server/image_header.h), so a
 * bad file fails the parse from sf_st_feed() with a jpeg_*, png_* or webp_* code and sf_st_bad_sample() names it. The
 * sum of the samples' pixels is bounded by limits.jpeg_max_batch_pixels
 * (jpeg_batch_too_large), so the decoded batch always fits the decoders'
 * buffers, which are sized once from that bound.
 *
 * The writer sf_st_header_build() builds the 8-byte length plus the JSON header
 * for tensors stored back to back, for the transform endpoint, checkpoints and
 * the load generator.
 */
#ifndef STREAMFEED_SERVER_SAFETENSORS_H
#define STREAMFEED_SERVER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The safetensors element types. The first eleven keep their historical
 * values; the members after SF_ST_BOOL are later additions of the format. */
typedef enum sf_st_dtype {
    SF_ST_U8, SF_ST_I8, SF_ST_U16, SF_ST_I16, SF_ST_I32, SF_ST_I64,
    SF_ST_F16, SF_ST_BF16, SF_ST_F32, SF_ST_F64, SF_ST_BOOL,
    SF_ST_U32, SF_ST_U64, SF_ST_F8_E5M2, SF_ST_F8_E4M3, SF_ST_F8_E8M0, SF_ST_C64,
    SF_ST_DTYPE_COUNT
} sf_st_dtype;

/* Limits. A field left 0 takes the default named below, except classes, where
 * 0 means "label values are not checked". */
typedef struct sf_st_limits {
    uint64_t max_header_bytes;  /* JSON header length; default SF_ST_DEFAULT_MAX_HEADER_BYTES */
    uint64_t max_body_bytes;    /* whole body, 8 + header + data; default SF_ST_DEFAULT_MAX_BODY_BYTES */
    int max_n, max_h, max_w;    /* batch size and image height/width; default SF_ST_DEFAULT_MAX_DIM each */
    int classes;                /* label values must lie in [0, classes); 0: unchecked */
    int labels_required;        /* 1: a body without "labels" fails with missing_labels */
    /* The "jpeg" form: bounds of each file's header (0: unbounded) and of the
     * batch's decoded pixels, the sum of h*w over its samples (0: unbounded). */
    int jpeg_max_side;
    int64_t jpeg_max_pixels;
    int64_t jpeg_max_batch_pixels;
    int jpeg_off;               /* 1: the "jpeg" form is refused (jpeg_batch_too_large) */
} sf_st_limits;

#define SF_ST_DEFAULT_MAX_HEADER_BYTES ((uint64_t)64 * 1024)
#define SF_ST_DEFAULT_MAX_BODY_BYTES   ((uint64_t)1024 * 1024 * 1024)
#define SF_ST_DEFAULT_MAX_DIM          65536
/* JSON nesting depth the raw header may reach: object, tensor object, shape
 * array is 3; anything deeper than this fails with header_too_deep. */
#define SF_ST_MAX_DEPTH 4
/* Labels start at dest + align_up(images_bytes, SF_ST_LABEL_ALIGN). */
#define SF_ST_LABEL_ALIGN 64

/* What the header says; valid from SF_ST_NEED_DEST on. */
typedef struct sf_st_info {
    int n, h, w, c;          /* batch size, height, width, channels */
    int nhwc;                /* 1: images are [N,H,W,C]; 0: [N,C,H,W] */
    int has_labels;          /* 0 only in labels-optional mode */
    sf_st_dtype label_dtype; /* U8, I32 or I64 */
    int label_ndim;          /* 1: [N]; 3: [N,H,W]; 0 without labels */
    int64_t label_shape[3];
    uint64_t header_len;     /* JSON header bytes, padding included */
    uint64_t data_len;       /* data section bytes */
    uint64_t body_len;       /* 8 + header_len + data_len: the exact body length */
    uint64_t images_bytes, labels_bytes;
    uint64_t labels_dest_off; /* align_up(images_bytes, 64); 0 without labels */
    uint64_t dest_bytes;      /* the smallest dest capacity sf_st_set_dest accepts */
    /* The "jpeg" form (encoded = 1): images_bytes are the n files
     * concatenated, at dest + 0; h, w are 0 and c is 3 (every file decodes
     * to 3 channels). The other fields are 0 in the pixel form. */
    int encoded;
    /* The names the body gave the encoded tensors: "files" and
     * "files_offsets", or their aliases "jpeg" and "jpeg_offsets"; messages
     * and refusals' fields ("files[3]") use them. NULL in the pixel form. */
    const char *files_name, *offsets_name;
    uint64_t jpeg_offsets_dest_off; /* int64 [n+1]: file i is dest[off[i], off[i+1]) */
    uint64_t jpeg_info_dest_off;    /* sf_jpeg_info [n], filled as each file's header is read */
    /* Valid once the body is complete (SF_ST_COMPLETE): */
    int64_t jpeg_pixels;            /* sum of h*w over the samples */
    int jpeg_max_h, jpeg_max_w;     /* the largest height and width in the batch */
} sf_st_info;

typedef enum sf_st_state {
    SF_ST_HEADER,    /* wants more header bytes */
    SF_ST_NEED_DEST, /* header valid; call sf_st_set_dest */
    SF_ST_DATA,      /* copying data bytes into dest */
    SF_ST_COMPLETE,  /* all data copied; call sf_st_finish */
    SF_ST_FAILED
} sf_st_state;

/* Every way a body can be rejected, one per error code string (so a metrics
 * registry can pre-create one counter per reason: see sf_st_error_name). */
typedef enum sf_st_error {
    SF_ST_OK = 0,
    SF_ST_E_HEADER_LENGTH_INVALID, SF_ST_E_HEADER_TOO_LARGE, SF_ST_E_HEADER_NOT_JSON,
    SF_ST_E_HEADER_NOT_OBJECT, SF_ST_E_HEADER_TOO_DEEP, SF_ST_E_DUPLICATE_KEY,
    SF_ST_E_BAD_METADATA, SF_ST_E_UNKNOWN_TENSOR, SF_ST_E_BAD_TENSOR,
    SF_ST_E_MISSING_IMAGES, SF_ST_E_MISSING_LABELS, SF_ST_E_UNKNOWN_DTYPE,
    SF_ST_E_UNSUPPORTED_DTYPE, SF_ST_E_BAD_SHAPE, SF_ST_E_BAD_LAYOUT,
    SF_ST_E_SHAPE_SIZE_MISMATCH, SF_ST_E_BAD_OFFSETS, SF_ST_E_OFFSETS_OVERLAP,
    SF_ST_E_DATA_NOT_CONTIGUOUS, SF_ST_E_LABEL_COUNT_MISMATCH, SF_ST_E_IMAGE_TOO_LARGE,
    SF_ST_E_BATCH_TOO_LARGE, SF_ST_E_BODY_TOO_LARGE, SF_ST_E_BODY_TOO_LONG,
    SF_ST_E_BODY_TOO_SHORT, SF_ST_E_LABEL_OUT_OF_RANGE, SF_ST_E_SLOT_TOO_SMALL,
    SF_ST_E_OUT_OF_MEMORY, /* the header buffer could not be allocated */
    SF_ST_E_BAD_CALL,      /* an API call out of order (a bug in the caller) */
    /* The "jpeg" form: sf_st_bad_sample() names the sample. The six
     * jpeg_* codes of one file are server/jpeg_header.h's, in its order. */
    SF_ST_E_JPEG_OFFSETS_INVALID, SF_ST_E_JPEG_NOT_JPEG, SF_ST_E_JPEG_TRUNCATED,
    SF_ST_E_JPEG_MALFORMED, SF_ST_E_JPEG_SIDE_TOO_LARGE, SF_ST_E_JPEG_TOO_MANY_PIXELS,
    SF_ST_E_JPEG_UNSUPPORTED, SF_ST_E_PNG_TRUNCATED, SF_ST_E_PNG_MALFORMED, SF_ST_E_PNG_UNSUPPORTED,
    SF_ST_E_WEBP_TRUNCATED, SF_ST_E_WEBP_MALFORMED, SF_ST_E_WEBP_UNSUPPORTED, SF_ST_E_JPEG_BATCH_TOO_LARGE,
    SF_ST_ERROR_COUNT
} sf_st_error;

#define SF_ST_MSG_CAP 256

/* One request's parser. Public so that it can be embedded without a malloc;
 * treat the fields as private and use the functions below. */
typedef struct sf_st_parser {
    sf_st_limits lim;       /* with defaults applied */
    sf_st_state state;
    sf_st_error err;
    sf_st_info info;
    int have_info;          /* the header was accepted */
    /* header */
    uint8_t len_buf[8];
    unsigned len_have;
    char *hdr;              /* header_len + 1 bytes, NUL-terminated once complete */
    uint64_t hdr_have;
    /* raw JSON scan done while the header arrives */
    int scan_depth, scan_in_str, scan_esc, scan_uhex, scan_unonzero;
    /* data */
    uint64_t images_begin, labels_begin; /* offsets in the data section */
    uint64_t data_have;
    uint8_t *dest;
    size_t dest_cap;
    int labels_checked;
    int64_t bad_label_index, bad_label_value;
    /* the "jpeg" form */
    uint64_t offsets_begin;
    int offsets_checked;
    int jpeg_next;          /* samples [0, jpeg_next) have valid headers */
    int64_t bad_sample;
    char msg[SF_ST_MSG_CAP];
} sf_st_parser;

/* Starts a parser; lim may be NULL (all defaults). Allocates nothing. */
void sf_st_init(sf_st_parser *p, const sf_st_limits *lim);
/* Releases the header buffer and starts over with the same limits. */
void sf_st_reset(sf_st_parser *p);
/* Releases the header buffer; idempotent. The parser may be re-initialised. */
void sf_st_free(sf_st_parser *p);

/* Feeds the next body bytes and returns how many it consumed. It consumes
 * nothing in SF_ST_NEED_DEST and SF_ST_FAILED, and stops at the end of the
 * header. A chunk that reaches past the end of the body fails with
 * body_too_long as soon as the first extra byte arrives; the bytes before it
 * are consumed (copied, and the labels checked) first, so that the outcome does
 * not depend on how the body was chunked. */
size_t sf_st_feed(sf_st_parser *p, const uint8_t *data, size_t len);

sf_st_state sf_st_state_of(const sf_st_parser *p);
/* The header's contents, from SF_ST_NEED_DEST on (also after a failure in the
 * data phase); NULL before the header was accepted. */
const sf_st_info *sf_st_info_of(const sf_st_parser *p);

/* Gives the destination; only in SF_ST_NEED_DEST. cap < info.dest_bytes fails
 * with slot_too_small. The caller keeps ownership of dest. */
void sf_st_set_dest(sf_st_parser *p, uint8_t *dest, size_t cap);

/* Call when the body has ended: 0 if the whole body arrived and was valid,
 * else -1 with the error set (body_too_short, or an earlier failure such as
 * label_out_of_range). Idempotent. */
int sf_st_finish(sf_st_parser *p);

/* "ok" while nothing failed, else a stable snake_case code. */
const char *sf_st_error_code(const sf_st_parser *p);
/* "" while nothing failed, else a sentence naming the tensor, field and value. */
const char *sf_st_error_message(const sf_st_parser *p);
sf_st_error sf_st_error_of(const sf_st_parser *p);
/* The code string of an error value ("ok" for SF_ST_OK), NULL if out of range. */
const char *sf_st_error_name(sf_st_error e);
/* After label_out_of_range: the flat index of the first bad label and its value. */
int64_t sf_st_bad_label_index(const sf_st_parser *p);
int64_t sf_st_bad_label_value(const sf_st_parser *p);
/* After a failure of one JPEG file (the jpeg_* codes but jpeg_offsets_invalid):
 * the sample's index; -1 otherwise. */
int64_t sf_st_bad_sample(const sf_st_parser *p);

/* "U8", "I64", ...; NULL if d is out of range. */
const char *sf_st_dtype_name(sf_st_dtype d);
/* Element size in bytes; 0 if d is out of range. */
int sf_st_dtype_size(sf_st_dtype d);
/* 0 and *out set when s names one of the dtypes above, else -1. */
int sf_st_dtype_parse(const char *s, sf_st_dtype *out);

/* Writer. One tensor of the header to build; ndim 0..8, dims >= 0. */
typedef struct sf_st_tensor_desc {
    const char *name;
    sf_st_dtype dtype;
    int ndim;
    int64_t shape[8];
} sf_st_tensor_desc;

/* Builds the 8-byte length + JSON header (padded with spaces to a multiple of
 * 8 bytes, as the reference implementation does) for the nt tensors stored
 * back to back in the given order, data_offsets starting at 0.
 * metadata_json may be NULL or the text of a JSON object whose values are all
 * strings; it is written first, as "__metadata__".
 * Returns the header size in bytes (8 + padded JSON). The header was written
 * only if buf != NULL and the returned size is <= cap; otherwise the return
 * value is the size needed and buf holds nothing valid. Returns 0 on invalid
 * input (NULL or empty or duplicate or "__metadata__" name, unknown dtype,
 * ndim out of range, negative dim, byte size overflow, bad metadata_json). */
size_t sf_st_header_build(char *buf, size_t cap, const sf_st_tensor_desc *t, int nt,
                          const char *metadata_json);

/* ---- whole files ----------------------------------------------------------
 *
 * A file held in memory (a checkpoint) read with the same rules as an upload:
 * the raw header scan (depth, control characters, \u0000), UTF-8, strict JSON,
 * every entry's dtype, shape and data_offsets, no name twice, and entries
 * that tile the data section exactly. The tensors' names and roles are the
 * caller's business. The entries point into the file's parsed header and live
 * until sf_st_file_free. */
typedef struct sf_st_entry {
    const char *name;
    sf_st_dtype dtype;
    int ndim;            /* at most 8 are read */
    int64_t shape[8];
    uint64_t begin, end; /* data_offsets, into the data section */
} sf_st_entry;

typedef struct sf_st_file {
    sf_st_entry *tensors; /* in header order, __metadata__ left out */
    int n;
    const uint8_t *data;  /* the data section, inside the caller's buffer */
    uint64_t data_len, header_len;
    sf_st_error err;      /* after a failure: the stable code (sf_st_error_name) ... */
    char msg[SF_ST_MSG_CAP]; /* ... and a sentence */
    void *json_, *meta_;  /* private */
} sf_st_file;

/* Reads len bytes at buf; 0, or -1 with f->err and f->msg set (nothing to
 * free then). max_header_bytes 0 takes the default; at most max_tensors
 * entries are looked at. buf must outlive f. */
int sf_st_file_read(sf_st_file *f, const uint8_t *buf, size_t len, uint64_t max_header_bytes,
                    int max_tensors);
/* A __metadata__ value, or NULL when the file has none under key. */
const char *sf_st_file_meta(const sf_st_file *f, const char *key);
void sf_st_file_free(sf_st_file *f);

#ifdef __cplusplus
}
#endif

#endif /* STREAMFEED_SERVER_SAFETENSORS_H */
