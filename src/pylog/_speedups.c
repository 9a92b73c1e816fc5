/* pylog._speedups: the per-record hot loops of pylog's batch format, compiled.
 *
 * The format is defined once, in the docstring of pylog/record.py (the byte tables); this file implements
 * loops over it and nothing else. Python keeps every decision: pylog.record configures this module with the
 * classes and callables it needs (the header tuple type, the error classes, CRC-32C, decompression, header
 * decoding) and chooses when to call it (pylog.speedups says whether it is in use). Every function here has a
 * pure-Python twin in pylog.record or pylog.fetcher that produces the same bytes, the same records and the same
 * error types; tests/property/test_speedups_properties.py checks both on random and mutated input.
 *
 * Memory safety: every read of a buffer is bounds-checked against its length before it happens (the decoder
 * is fuzzed with random and mutated bytes, and run under AddressSanitizer by `make sanitize`). Integer sums
 * are done in 64 bits from values that cannot overflow them (record counts are < 2^24, lengths < 2^31).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* --- the byte table of pylog/record.py, as offsets (all little-endian) ----------------------------------- */
#define HEADER_SIZE 64
#define LAYOUT_SIZE 8
#define CRC_START 16
#define MAGIC 1
#define MAX_RECORDS (1 << 24)
#define ATTR_COMPRESSION_MASK 0x07
#define ATTR_LOG_APPEND_TIME 0x08
#define ATTR_TRANSACTIONAL 0x10
#define ATTR_CONTROL 0x20
#define HEADER_FIELDS 15

/* --- what pylog.record hands over at import (configure()) ------------------------------------------------ */
static PyObject *BatchHeaderType;   /* pylog.record.BatchHeader (a NamedTuple) */
static PyObject *NoHeaders;         /* pylog.structs.NO_HEADERS */
static PyObject *DecodeHeaders;     /* pylog.record.decode_headers(bytes) -> Headers */
static PyObject *Crc32c;            /* crc32c(data, value=0) -> int */
static PyObject *Decompress;        /* pylog.record._decompress(code, body, size) -> bytes */
static PyObject *Compress;          /* pylog.record._compress(code, payload) -> bytes */
static PyObject *CorruptError;      /* pylog.errors.CorruptRecordError */
static PyObject *UnsupportedError;  /* pylog.errors.UnsupportedFormatError */
static PyObject *str_position;      /* "position" */

static int configured(void) {
    if (BatchHeaderType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pylog._speedups is not configured (pylog.record does it)");
        return 0;
    }
    return 1;
}

static inline uint64_t rd_u(const unsigned char *p, int width) {
    switch (width) {
    case 1: return p[0];
    case 2: return (uint64_t)p[0] | ((uint64_t)p[1] << 8);
    case 4: return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) | ((uint64_t)p[3] << 24);
    default: {
        uint64_t v = 0;
        for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
        return v;
    }
    }
}

static inline int64_t rd_s(const unsigned char *p, int width) {
    switch (width) {
    case 1: return (int8_t)p[0];
    case 2: return (int16_t)(uint16_t)rd_u(p, 2);
    case 4: return (int32_t)(uint32_t)rd_u(p, 4);
    default: return (int64_t)rd_u(p, 8);
    }
}

static inline void wr_u(unsigned char *p, uint64_t v, int width) {
    for (int i = 0; i < width; i++) {
        p[i] = (unsigned char)(v & 0xff);
        v >>= 8;
    }
}

/* Raise CorruptRecordError(message, position=position); position < 0 leaves it out. Returns NULL. */
static PyObject *corrupt(Py_ssize_t position, const char *fmt, ...) {
    va_list va;
    va_start(va, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (msg == NULL) return NULL;
    PyObject *args = PyTuple_Pack(1, msg);
    Py_DECREF(msg);
    if (args == NULL) return NULL;
    PyObject *kwargs = NULL;
    if (position >= 0) {
        kwargs = PyDict_New();
        PyObject *pos = PyLong_FromSsize_t(position);
        if (kwargs == NULL || pos == NULL || PyDict_SetItem(kwargs, str_position, pos) < 0) {
            Py_XDECREF(pos);
            Py_XDECREF(kwargs);
            Py_DECREF(args);
            return NULL;
        }
        Py_DECREF(pos);
    }
    PyObject *exc = PyObject_Call(CorruptError, args, kwargs);
    Py_DECREF(args);
    Py_XDECREF(kwargs);
    if (exc != NULL) {
        PyErr_SetObject(CorruptError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* --- the batch header ------------------------------------------------------------------------------------ */
typedef struct {
    int64_t base_offset;
    int32_t batch_length;
    uint32_t crc;
    uint8_t magic, reserved;
    int16_t attributes;
    int32_t last_offset_delta;
    int64_t base_timestamp, max_timestamp, producer_id;
    int16_t producer_epoch;
    uint16_t reserved2;
    int32_t base_sequence, record_count, payload_length;
} Header;

static void parse_header(const unsigned char *p, Header *h) {
    h->base_offset = rd_s(p + 0, 8);
    h->batch_length = (int32_t)rd_s(p + 8, 4);
    h->crc = (uint32_t)rd_u(p + 12, 4);
    h->magic = p[16];
    h->reserved = p[17];
    h->attributes = (int16_t)rd_s(p + 18, 2);
    h->last_offset_delta = (int32_t)rd_s(p + 20, 4);
    h->base_timestamp = rd_s(p + 24, 8);
    h->max_timestamp = rd_s(p + 32, 8);
    h->producer_id = rd_s(p + 40, 8);
    h->producer_epoch = (int16_t)rd_s(p + 48, 2);
    h->reserved2 = (uint16_t)rd_u(p + 50, 2);
    h->base_sequence = (int32_t)rd_s(p + 52, 4);
    h->record_count = (int32_t)rd_s(p + 56, 4);
    h->payload_length = (int32_t)rd_s(p + 60, 4);
}

/* The checks of pylog.record.decode_header, in its order. 0 when the header is sound, -1 with an error set. */
static int check_header(const unsigned char *data, Py_ssize_t len, Py_ssize_t position, Header *h) {
    if (position < 0 || position > len || len - position < HEADER_SIZE) {
        corrupt(position, "truncated batch header at position %zd", position);
        return -1;
    }
    parse_header(data + position, h);
    if (h->magic != MAGIC) {
        if (h->magic > MAGIC && h->batch_length >= HEADER_SIZE) {
            PyErr_Format(UnsupportedError,
                         "batch at position %zd has format version %d; this pylog reads version %d", position,
                         (int)h->magic, MAGIC);
            return -1;
        }
        corrupt(position, "bad magic %d at position %zd", (int)h->magic, position);
        return -1;
    }
    if (h->batch_length < HEADER_SIZE + LAYOUT_SIZE || (Py_ssize_t)h->batch_length > len - position) {
        corrupt(position, "batch length %d at position %zd is out of bounds", (int)h->batch_length, position);
        return -1;
    }
    if (h->record_count < 1 || h->record_count > MAX_RECORDS || h->last_offset_delta < h->record_count - 1) {
        corrupt(position, "bad record count or offset delta at position %zd", position);
        return -1;
    }
    if (h->base_offset < 0 || h->base_offset > INT64_MAX - (int64_t)h->last_offset_delta ||
        h->payload_length < LAYOUT_SIZE || h->max_timestamp < h->base_timestamp) {
        corrupt(position, "impossible header field values at position %zd", position);
        return -1;
    }
    return 0;
}

static PyObject *header_tuple(const Header *h) {
    PyObject *t = PyType_GenericAlloc((PyTypeObject *)BatchHeaderType, HEADER_FIELDS);
    if (t == NULL) return NULL;
    PyObject *v[HEADER_FIELDS] = {
        PyLong_FromLongLong(h->base_offset),    PyLong_FromLong(h->batch_length),
        PyLong_FromUnsignedLong(h->crc),        PyLong_FromLong(h->magic),
        PyLong_FromLong(h->reserved),           PyLong_FromLong(h->attributes),
        PyLong_FromLong(h->last_offset_delta),  PyLong_FromLongLong(h->base_timestamp),
        PyLong_FromLongLong(h->max_timestamp),  PyLong_FromLongLong(h->producer_id),
        PyLong_FromLong(h->producer_epoch),     PyLong_FromLong(h->reserved2),
        PyLong_FromLong(h->base_sequence),      PyLong_FromLong(h->record_count),
        PyLong_FromLong(h->payload_length),
    };
    int failed = 0;
    for (int i = 0; i < HEADER_FIELDS; i++) {
        if (v[i] == NULL) failed = 1;
        PyTuple_SET_ITEM(t, i, v[i]);
    }
    if (failed) {
        Py_DECREF(t);
        return NULL;
    }
    return t;
}

/* CRC-32C (Castagnoli) of data[0:len]. Short buffers (a batch of a few records) are summed here with the
 * SSE 4.2 crc32 instruction when the CPU has it: calling the crc32c package costs more than its work there
 * (a memoryview, a call, an int: ~0.3-0.6 us). Longer ones, and CPUs without the instruction, go to the
 * configured crc32c function (the crc32c package, which interleaves streams for large buffers). */
#define NATIVE_CRC_MAX 4096

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_NATIVE_CRC 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(const unsigned char *p, size_t len) {
    uint64_t crc = 0xFFFFFFFFu;
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        crc = __builtin_ia32_crc32di(crc, word);
        p += 8;
        len -= 8;
    }
    uint32_t c = (uint32_t)crc;
    while (len--) c = __builtin_ia32_crc32qi(c, *p++);
    return c ^ 0xFFFFFFFFu;
}
static int native_crc = -1; /* -1: not checked yet */
#endif

static int crc_of(const unsigned char *data, Py_ssize_t len, uint32_t *out) {
#ifdef HAVE_NATIVE_CRC
    if (native_crc < 0) native_crc = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    if (native_crc && len <= NATIVE_CRC_MAX) {
        *out = crc32c_sse42(data, (size_t)len);
        return 0;
    }
#endif
    /* the memoryview is over memory the caller holds a buffer of; crc32c keeps no reference to it */
    PyObject *part = PyMemoryView_FromMemory((char *)data, len, PyBUF_READ);
    if (part == NULL) return -1;
    PyObject *crc = PyObject_CallOneArg(Crc32c, part);
    Py_DECREF(part);
    if (crc == NULL) return -1;
    unsigned long v = PyLong_AsUnsignedLong(crc);
    Py_DECREF(crc);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    *out = (uint32_t)v;
    return 0;
}

PyDoc_STRVAR(crc32c_doc,
"crc32c(data) -> int\n\n"
"CRC-32C of a bytes-like object, as the crc32c package computes it (the same sum, any length; short\n"
"buffers natively). For tests of the native sum.");

static PyObject *crc32c_py(PyObject *self, PyObject *arg) {
    if (!configured()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t crc;
    int rc = crc_of(view.buf, view.len, &crc);
    PyBuffer_Release(&view);
    return rc < 0 ? NULL : PyLong_FromUnsignedLong(crc);
}

/* --- record headers: the msgpack arrays pylog.record.encode_headers writes ---------------------------------- */
/* A record's headers blob is a msgpack array of [str, bytes | nil] pairs (pylog.record.encode_headers). This
 * reads exactly what encode_headers writes; for anything else (another msgpack encoder's choices, a damaged
 * blob) it returns NULL without an exception and the caller runs pylog.record.decode_headers, which decides. */
static inline int mp_len(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos, int width, Py_ssize_t *out) {
    if (end - *pos < width) return -1;
    uint64_t v = 0;
    for (int i = 0; i < width; i++) v = (v << 8) | p[*pos + i]; /* big-endian */
    *pos += width;
    *out = (Py_ssize_t)v;
    return 0;
}

static PyObject *fast_headers(const unsigned char *p, Py_ssize_t end) {
    Py_ssize_t pos = 0, n;
    if (end < 1) return NULL;
    unsigned char b = p[pos++];
    if (b >= 0x90 && b <= 0x9f)
        n = b & 0x0f;
    else if (b == 0xdc) {
        if (mp_len(p, end, &pos, 2, &n) < 0) return NULL;
    } else if (b == 0xdd) {
        if (mp_len(p, end, &pos, 4, &n) < 0) return NULL;
    } else
        return NULL;
    if (n > end) return NULL; /* each pair takes at least 3 bytes */
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        PyErr_Clear();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t kl, vl;
        if (pos >= end || p[pos++] != 0x92 || pos >= end) goto fallback;
        b = p[pos++];
        if (b >= 0xa0 && b <= 0xbf)
            kl = b & 0x1f;
        else if (b == 0xd9) {
            if (mp_len(p, end, &pos, 1, &kl) < 0) goto fallback;
        } else if (b == 0xda) {
            if (mp_len(p, end, &pos, 2, &kl) < 0) goto fallback;
        } else if (b == 0xdb) {
            if (mp_len(p, end, &pos, 4, &kl) < 0) goto fallback;
        } else
            goto fallback;
        if (kl > end - pos) goto fallback;
        PyObject *key = PyUnicode_DecodeUTF8((const char *)p + pos, kl, "strict");
        if (key == NULL) goto fallback;
        pos += kl;
        PyObject *value = NULL;
        if (pos < end && p[pos] == 0xc0) {
            pos++;
            value = Py_NewRef(Py_None);
        } else if (pos < end && p[pos] >= 0xc4 && p[pos] <= 0xc6) {
            int width = p[pos] == 0xc4 ? 1 : p[pos] == 0xc5 ? 2 : 4;
            pos++;
            if (mp_len(p, end, &pos, width, &vl) == 0 && vl <= end - pos) {
                value = PyBytes_FromStringAndSize((const char *)p + pos, vl);
                pos += vl;
            }
        }
        PyObject *pair = value ? PyTuple_Pack(2, key, value) : NULL;
        Py_DECREF(key);
        Py_XDECREF(value);
        if (pair == NULL) goto fallback;
        PyList_SET_ITEM(out, i, pair);
    }
    if (pos == end) return out;
fallback:
    PyErr_Clear();
    Py_DECREF(out); /* unset items are NULL: list_dealloc skips them */
    return NULL;
}

/* The msgpack array of [str, bytes | nil] pairs pylog.record.encode_headers writes (msgpack's own choice of
 * sizes: fix forms, then str8/bin8, 16 and 32-bit lengths, big-endian). */
static inline unsigned char *mp_head(unsigned char *w, Py_ssize_t n, unsigned char fix, Py_ssize_t fix_max,
                                     unsigned char b8, unsigned char b16, unsigned char b32) {
    if (n <= fix_max) {
        *w++ = (unsigned char)(fix | n);
    } else if (b8 && n < 256) {
        *w++ = b8;
        *w++ = (unsigned char)n;
    } else if (n < 65536) {
        *w++ = b16;
        *w++ = (unsigned char)(n >> 8);
        *w++ = (unsigned char)n;
    } else {
        *w++ = b32;
        for (int s = 24; s >= 0; s -= 8) *w++ = (unsigned char)(n >> s);
    }
    return w;
}

static inline Py_ssize_t mp_head_size(Py_ssize_t n, Py_ssize_t fix_max, int has8) {
    return n <= fix_max ? 1 : (has8 && n < 256) ? 2 : n < 65536 ? 3 : 5;
}

PyDoc_STRVAR(encode_headers_doc,
"encode_headers(headers) -> bytes | NotImplemented\n\n"
"pylog.record.encode_headers for a list or tuple of (str, bytes | None) tuples or lists; NotImplemented for\n"
"anything else (pylog.record.encode_headers checks and refuses it, or converts it).");

static PyObject *encode_headers(PyObject *self, PyObject *headers) {
    if (!PyList_CheckExact(headers) && !PyTuple_CheckExact(headers)) Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(headers);
    if (n == 0) return PyBytes_FromStringAndSize(NULL, 0);
    Py_ssize_t size = mp_head_size(n, 15, 0);
    for (int pass = 0; pass < 2; pass++) {
        PyObject *out = NULL;
        unsigned char *w = NULL;
        if (pass == 1) {
            out = PyBytes_FromStringAndSize(NULL, size);
            if (out == NULL) return NULL;
            w = (unsigned char *)PyBytes_AS_STRING(out);
            w = mp_head(w, n, 0x90, 15, 0, 0xdc, 0xdd);
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PySequence_Fast_GET_ITEM(headers, i);
            if ((!PyTuple_CheckExact(item) && !PyList_CheckExact(item)) || PySequence_Fast_GET_SIZE(item) != 2) {
                Py_XDECREF(out);
                Py_RETURN_NOTIMPLEMENTED;
            }
            PyObject *key = PySequence_Fast_GET_ITEM(item, 0), *value = PySequence_Fast_GET_ITEM(item, 1);
            if (!PyUnicode_CheckExact(key) || (value != Py_None && !PyBytes_CheckExact(value))) {
                Py_XDECREF(out);
                Py_RETURN_NOTIMPLEMENTED;
            }
            Py_ssize_t kl;
            const char *k = PyUnicode_AsUTF8AndSize(key, &kl);
            if (k == NULL || kl > UINT32_MAX || (value != Py_None && PyBytes_GET_SIZE(value) > UINT32_MAX)) {
                PyErr_Clear(); /* a lone surrogate: encode_headers raises what it raises */
                Py_XDECREF(out);
                Py_RETURN_NOTIMPLEMENTED;
            }
            Py_ssize_t vl = value == Py_None ? -1 : PyBytes_GET_SIZE(value);
            if (pass == 0) {
                size += 1 + mp_head_size(kl, 31, 1) + kl + (vl < 0 ? 1 : mp_head_size(vl, -1, 1) + vl);
                continue;
            }
            *w++ = 0x92;
            w = mp_head(w, kl, 0xa0, 31, 0xd9, 0xda, 0xdb);
            memcpy(w, k, (size_t)kl);
            w += kl;
            if (vl < 0) {
                *w++ = 0xc0;
            } else {
                w = mp_head(w, vl, 0, -1, 0xc4, 0xc5, 0xc6);
                memcpy(w, PyBytes_AS_STRING(value), (size_t)vl);
                w += vl;
            }
        }
        if (pass == 1) {
            if (w != (unsigned char *)PyBytes_AS_STRING(out) + size) {
                Py_DECREF(out);
                PyErr_SetString(PyExc_SystemError, "encode_headers: size mismatch");
                return NULL;
            }
            return out;
        }
    }
    Py_RETURN_NONE; /* not reached */
}

/* --- decoding a payload into lists ----------------------------------------------------------------------- */
/* What decode_records builds records of, straight from the payload (no lists in between). */
typedef struct {
    PyTypeObject *cls;   /* pylog.structs.ConsumerRecord */
    PyObject *topic, *partition;
    int64_t start;       /* records at offsets before it are left out */
    PyObject *out;       /* the list the records are appended to (kind 1: the Kafka records, bytes) */
    int kind;            /* 0: ConsumerRecords; 1: the records section of a Kafka batch (kafka_from_pylog) */
    int not_implemented; /* kind 1: something the C writer leaves to Python (set, with no exception) */
} Direct;

static int build_kafka(const Header *h, const unsigned char *payload, Py_ssize_t at, int64_t key_total,
                       int64_t value_total, const unsigned char *ts_col, int ts_w, const unsigned char *delta_col,
                       int delta_w, const unsigned char *key_col, int key_w, const unsigned char *value_col,
                       int value_w, const unsigned char *header_col, int header_w, Direct *d);

typedef struct {
    PyObject *offsets, *timestamps, *keys, *values, *headers, *ksizes, *vsizes;
    Py_ssize_t value_start, value_end; /* the value bytes within the payload */
    int values_null;                   /* some value is None */
    Direct *direct;                    /* set: build records into direct->out instead of the lists */
} Lists;

static void lists_clear(Lists *l) {
    Py_CLEAR(l->offsets);
    Py_CLEAR(l->timestamps);
    Py_CLEAR(l->keys);
    Py_CLEAR(l->values);
    Py_CLEAR(l->headers);
    Py_CLEAR(l->ksizes);
    Py_CLEAR(l->vsizes);
}

static int width_ok(int w, int allow0, int allow8) {
    return (w == 1 || w == 2 || w == 4 || (allow0 && w == 0) || (allow8 && w == 8));
}

/* A key or value column: the sizes (checked >= -1), their sum of non-null bytes, whether any is null. */
static int length_column(const unsigned char *col, int width, Py_ssize_t n, int64_t *total, int *nulls) {
    int64_t sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = rd_s(col + i * width, width);
        if (v < -1) return -1;
        if (v < 0)
            *nulls = 1;
        else
            sum += v;
    }
    *total = sum;
    return 0;
}

/* Bytes objects (None for a length of -1) from a length column over data starting at *at; sizes as ints. */
static int slice_column(const unsigned char *payload, Py_ssize_t *at, const unsigned char *col, int width,
                        Py_ssize_t n, PyObject *items, PyObject *sizes) {
    Py_ssize_t pos = *at;
    PyObject *minus1 = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t len = rd_s(col + i * width, width);
        PyObject *item, *size;
        if (len < 0) {
            item = Py_NewRef(Py_None);
            if (minus1 == NULL) minus1 = PyLong_FromLong(-1);
            if (minus1 == NULL) {
                Py_DECREF(item);
                return -1;
            }
            size = Py_NewRef(minus1);
        } else {
            item = PyBytes_FromStringAndSize((const char *)payload + pos, (Py_ssize_t)len);
            size = PyLong_FromLongLong(len);
            pos += (Py_ssize_t)len;
            if (item == NULL || size == NULL) {
                Py_XDECREF(item);
                Py_XDECREF(size);
                Py_XDECREF(minus1);
                return -1;
            }
        }
        PyList_SET_ITEM(items, i, item);
        if (sizes != NULL)
            PyList_SET_ITEM(sizes, i, size);
        else
            Py_DECREF(size);
    }
    Py_XDECREF(minus1);
    *at = pos;
    return 0;
}

/* A record's headers from its blob (NO_HEADERS for none): the form encode_headers writes in C, any other by
 * pylog.record.decode_headers. */
static PyObject *record_headers(const unsigned char *blob, Py_ssize_t len) {
    if (len == 0) return Py_NewRef(NoHeaders);
    PyObject *hv = fast_headers(blob, len);
    if (hv != NULL) return hv;
    PyObject *raw = PyBytes_FromStringAndSize((const char *)blob, len);
    if (raw == NULL) return NULL;
    hv = PyObject_CallOneArg(DecodeHeaders, raw);
    Py_DECREF(raw);
    return hv;
}

/* kafka-python's serialized_header_size: UTF-8 bytes of the keys plus the value bytes; -1 for no headers. */
static int64_t header_size(PyObject *headers) {
    if (!PyList_Check(headers) || PyList_GET_SIZE(headers) == 0) return -1;
    int64_t total = 0;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(headers); j++) {
        PyObject *pair = PyList_GET_ITEM(headers, j);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) return -2;
        Py_ssize_t kl;
        if (PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &kl) == NULL) return -3;
        PyObject *v = PyTuple_GET_ITEM(pair, 1);
        total += kl;
        if (v != Py_None) {
            Py_ssize_t vl = PyObject_Length(v);
            if (vl < 0) return -3;
            total += vl;
        }
    }
    return total;
}

#define RECORD_FIELDS 13

/* The ConsumerRecords of a checked payload from offset d->start on, appended to d->out (fields in
 * ConsumerRecord's order: topic, partition, leader_epoch -1, offset, timestamp, timestamp_type, key, value,
 * headers, checksum None, key size, value size, header size). */
static int build_direct(const Header *h, const unsigned char *payload, Py_ssize_t at, int64_t key_total,
                        int64_t value_total, const unsigned char *ts_col, int ts_w, const unsigned char *delta_col,
                        int delta_w, const unsigned char *key_col, int key_w, const unsigned char *value_col,
                        int value_w, const unsigned char *header_col, int header_w, Direct *d) {
    Py_ssize_t n = h->record_count;
    Py_ssize_t kat = at, vat = at + (Py_ssize_t)key_total, hat = at + (Py_ssize_t)(key_total + value_total);
    PyObject *minus1 = PyLong_FromLong(-1);
    PyObject *ts_type = PyLong_FromLong(h->attributes & ATTR_LOG_APPEND_TIME ? 1 : 0);
    PyObject *shared_ts = ts_w ? NULL : PyLong_FromLongLong(h->base_timestamp);
    int rc = -1;
    if (minus1 == NULL || ts_type == NULL || (!ts_w && shared_ts == NULL)) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t off = h->base_offset + (delta_w ? (int64_t)rd_u(delta_col + i * delta_w, delta_w) : (int64_t)i);
        int64_t kl = rd_s(key_col + i * key_w, key_w), vl = rd_s(value_col + i * value_w, value_w);
        Py_ssize_t hl = header_col ? (Py_ssize_t)rd_u(header_col + i * header_w, header_w) : 0;
        Py_ssize_t k0 = kat, v0 = vat, h0 = hat;
        if (kl > 0) kat += (Py_ssize_t)kl;
        if (vl > 0) vat += (Py_ssize_t)vl;
        hat += hl;
        if (off < d->start) continue;
        PyObject *hv = record_headers(payload + h0, hl); /* may run Python: before the record exists */
        int64_t hsize = hv ? header_size(hv) : -1;
        PyObject *f[RECORD_FIELDS] = {
            Py_NewRef(d->topic),
            Py_NewRef(d->partition),
            Py_NewRef(minus1),
            PyLong_FromLongLong(off),
            ts_w ? PyLong_FromLongLong((int64_t)((uint64_t)h->base_timestamp + rd_u(ts_col + i * ts_w, ts_w)))
                 : Py_NewRef(shared_ts),
            Py_NewRef(ts_type),
            kl < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)payload + k0, (Py_ssize_t)kl),
            vl < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)payload + v0, (Py_ssize_t)vl),
            hv,
            Py_NewRef(Py_None),
            kl < 0 ? Py_NewRef(minus1) : PyLong_FromLongLong(kl),
            vl < 0 ? Py_NewRef(minus1) : PyLong_FromLongLong(vl),
            hsize < -1 ? NULL : PyLong_FromLongLong(hsize),
        };
        int failed = 0;
        for (int j = 0; j < RECORD_FIELDS; j++)
            if (f[j] == NULL) failed = 1;
        PyObject *r = failed ? NULL : d->cls->tp_alloc(d->cls, RECORD_FIELDS);
        if (r == NULL) {
            for (int j = 0; j < RECORD_FIELDS; j++) Py_XDECREF(f[j]);
            if (hsize == -2 && !PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "record headers must be (str, bytes) pairs");
            goto done;
        }
        for (int j = 0; j < RECORD_FIELDS; j++) PyTuple_SET_ITEM(r, j, f[j]);
        int appended = PyList_Append(d->out, r);
        Py_DECREF(r);
        if (appended < 0) goto done;
    }
    rc = 0;
done:
    Py_XDECREF(minus1);
    Py_XDECREF(ts_type);
    Py_XDECREF(shared_ts);
    return rc;
}

/* The checks of pylog.record._decode_columns / _small_lists over an (uncompressed) payload, building the lists.
 * Errors are CorruptRecordError with the reason, without a position (the caller adds it). */
static int decode_payload(const Header *h, const unsigned char *payload, Py_ssize_t plen, Lists *out) {
    Py_ssize_t n = h->record_count;
    if (plen < LAYOUT_SIZE) {
        corrupt(-1, "columns run past the payload");
        return -1;
    }
    int ts_w = payload[0], delta_w = payload[1], key_w = payload[2], value_w = payload[3], header_w = payload[4];
    if ((int64_t)LAYOUT_SIZE + (int64_t)n * (ts_w + delta_w + key_w + value_w + header_w) > (int64_t)plen) {
        corrupt(-1, "columns run past the payload");
        return -1;
    }
    Py_ssize_t at = LAYOUT_SIZE;
    /* timestamps */
    const unsigned char *ts_col = NULL;
    uint64_t span = (uint64_t)h->max_timestamp - (uint64_t)h->base_timestamp; /* max >= base: exact */
    if (ts_w) {
        if (!width_ok(ts_w, 0, 1)) {
            corrupt(-1, "bad column width %d", ts_w);
            return -1;
        }
        ts_col = payload + at;
        uint64_t lo = UINT64_MAX, hi = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t d = rd_u(ts_col + i * ts_w, ts_w);
            if (d < lo) lo = d;
            if (d > hi) hi = d;
        }
        if (hi != span || lo != 0) {
            corrupt(-1, "timestamps disagree with the batch header");
            return -1;
        }
        at += (Py_ssize_t)ts_w * n;
    } else if (span != 0) {
        corrupt(-1, "timestamps disagree with the batch header");
        return -1;
    }
    /* offset deltas */
    const unsigned char *delta_col = NULL;
    if (delta_w) {
        if (!width_ok(delta_w, 0, 0)) {
            corrupt(-1, "bad column width %d", delta_w);
            return -1;
        }
        delta_col = payload + at;
        uint64_t prev = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t d = rd_u(delta_col + i * delta_w, delta_w);
            if ((i == 0 && d != 0) || (i > 0 && d <= prev)) {
                corrupt(-1, "offset deltas are not increasing from 0 to last_offset_delta");
                return -1;
            }
            prev = d;
        }
        if (prev != (uint64_t)(int64_t)h->last_offset_delta) {
            corrupt(-1, "offset deltas are not increasing from 0 to last_offset_delta");
            return -1;
        }
        at += (Py_ssize_t)delta_w * n;
    } else if (h->last_offset_delta != n - 1) {
        corrupt(-1, "dense batch with wrong last_offset_delta");
        return -1;
    }
    /* key, value and header lengths */
    if (!width_ok(key_w, 0, 0)) {
        corrupt(-1, "bad column width %d", key_w);
        return -1;
    }
    const unsigned char *key_col = payload + at;
    at += (Py_ssize_t)key_w * n;
    if (!width_ok(value_w, 0, 0)) {
        corrupt(-1, "bad column width %d", value_w);
        return -1;
    }
    const unsigned char *value_col = payload + at;
    at += (Py_ssize_t)value_w * n;
    const unsigned char *header_col = NULL;
    if (header_w) {
        if (!width_ok(header_w, 0, 0)) {
            corrupt(-1, "bad column width %d", header_w);
            return -1;
        }
        header_col = payload + at;
        at += (Py_ssize_t)header_w * n;
    }
    int64_t key_total, value_total, header_total = 0;
    int key_nulls = 0, value_nulls = 0;
    if (length_column(key_col, key_w, n, &key_total, &key_nulls) < 0 ||
        length_column(value_col, value_w, n, &value_total, &value_nulls) < 0) {
        corrupt(-1, "negative record length");
        return -1;
    }
    for (Py_ssize_t i = 0; header_col && i < n; i++) header_total += (int64_t)rd_u(header_col + i * header_w, header_w);
    if ((int64_t)at + key_total + value_total + header_total != (int64_t)plen) {
        corrupt(-1, "record lengths do not add up to the payload length");
        return -1;
    }
    /* everything is in bounds */
    if (out->direct != NULL && out->direct->kind == 1)
        return build_kafka(h, payload, at, key_total, value_total, ts_col, ts_w, delta_col, delta_w, key_col, key_w,
                           value_col, value_w, header_col, header_w, out->direct);
    if (out->direct != NULL)
        return build_direct(h, payload, at, key_total, value_total, ts_col, ts_w, delta_col, delta_w, key_col, key_w,
                            value_col, value_w, header_col, header_w, out->direct);
    out->offsets = PyList_New(n);
    out->timestamps = PyList_New(n);
    out->keys = PyList_New(n);
    out->values = PyList_New(n);
    out->headers = PyList_New(n);
    out->ksizes = PyList_New(n);
    out->vsizes = PyList_New(n);
    if (!out->offsets || !out->timestamps || !out->keys || !out->values || !out->headers || !out->ksizes ||
        !out->vsizes)
        return -1;
    PyObject *shared_ts = ts_w ? NULL : PyLong_FromLongLong(h->base_timestamp);
    if (!ts_w && shared_ts == NULL) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t off = h->base_offset + (delta_w ? (int64_t)rd_u(delta_col + i * delta_w, delta_w) : (int64_t)i);
        PyObject *o = PyLong_FromLongLong(off);
        PyObject *t;
        if (ts_w)
            t = PyLong_FromLongLong((int64_t)((uint64_t)h->base_timestamp + rd_u(ts_col + i * ts_w, ts_w)));
        else
            t = Py_NewRef(shared_ts);
        if (o == NULL || t == NULL) {
            Py_XDECREF(o);
            Py_XDECREF(t);
            Py_XDECREF(shared_ts);
            return -1;
        }
        PyList_SET_ITEM(out->offsets, i, o);
        PyList_SET_ITEM(out->timestamps, i, t);
    }
    Py_XDECREF(shared_ts);
    if (slice_column(payload, &at, key_col, key_w, n, out->keys, out->ksizes) < 0) return -1;
    out->value_start = at;
    if (slice_column(payload, &at, value_col, value_w, n, out->values, out->vsizes) < 0) return -1;
    out->value_end = at;
    out->values_null = value_nulls;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t hl = header_col ? (Py_ssize_t)rd_u(header_col + i * header_w, header_w) : 0;
        PyObject *hv;
        if (hl == 0) {
            hv = Py_NewRef(NoHeaders);
        } else {
            hv = fast_headers(payload + at, hl);
            if (hv == NULL) { /* not what encode_headers writes: pylog.record.decode_headers decides */
                PyObject *raw = PyBytes_FromStringAndSize((const char *)payload + at, hl);
                if (raw == NULL) return -1;
                hv = PyObject_CallOneArg(DecodeHeaders, raw);
                Py_DECREF(raw);
                if (hv == NULL) return -1;
            }
            at += hl;
        }
        PyList_SET_ITEM(out->headers, i, hv);
    }
    return 0;
}

/* Re-raise the current CorruptRecordError as "<message> (batch at position N)" with its position, as
 * pylog.record.decode_batch does. */
static void add_position(Py_ssize_t position) {
    if (!PyErr_ExceptionMatches(CorruptError)) return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *text = value ? PyObject_Str(value) : NULL;
    if (text == NULL) {
        PyErr_Restore(type, value, tb);
        return;
    }
    corrupt(position, "%U (batch at position %zd)", text, position);
    Py_DECREF(text);
    PyObject *t2, *v2, *tb2;
    PyErr_Fetch(&t2, &v2, &tb2);
    PyErr_NormalizeException(&t2, &v2, &tb2);
    if (v2 != NULL && value != NULL) PyException_SetCause(v2, Py_NewRef(value));
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Restore(t2, v2, tb2);
}

static PyObject *decode_impl(PyObject *src, Py_ssize_t position, int verify, Direct *direct);

PyDoc_STRVAR(decode_lists_doc,
"decode_lists(buf, position, verify_crc=True) -> (header, offsets, timestamps, keys, values, headers,\n"
"    key_sizes, value_sizes, value_data)\n\n"
"The batch at ``position`` of ``buf`` as lists, with every check of pylog.record.decode_batch.\n"
"``value_data`` is a memoryview of the value bytes back to back (None when some value is None).");

static PyObject *decode_lists(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "decode_lists(buf, position, verify_crc=True)");
        return NULL;
    }
    if (!configured()) return NULL;
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    if (position == -1 && PyErr_Occurred()) return NULL;
    int verify = nargs < 3 ? 1 : PyObject_IsTrue(args[2]);
    if (verify < 0) return NULL;
    return decode_impl(args[0], position, verify, NULL);
}

PyDoc_STRVAR(decode_records_doc,
"decode_records(buf, position, start, cls, topic, partition) -> list\n\n"
"The records of the batch at ``position`` from offset ``start`` on, as ``cls`` tuples\n"
"(pylog.structs.ConsumerRecord), built straight from the payload: decode_lists then build_records in one\n"
"pass, with the same checks (for a consumer without key and value deserializers).");

static PyObject *decode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "decode_records(buf, position, start, cls, topic, partition)");
        return NULL;
    }
    if (!configured()) return NULL;
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    if (position == -1 && PyErr_Occurred()) return NULL;
    long long start = PyLong_AsLongLong(args[2]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    if (!PyType_Check(args[3]) || !PyType_IsSubtype((PyTypeObject *)args[3], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "cls must be a tuple subclass");
        return NULL;
    }
    Direct d = {(PyTypeObject *)args[3], args[4], args[5], start, PyList_New(0), 0, 0};
    if (d.out == NULL) return NULL;
    PyObject *got = decode_impl(args[0], position, 1, &d);
    if (got == NULL) {
        Py_DECREF(d.out);
        return NULL;
    }
    Py_DECREF(got);
    return d.out;
}

static PyObject *decode_impl(PyObject *src, Py_ssize_t position, int verify, Direct *direct) {
    Py_buffer view;
    if (PyObject_GetBuffer(src, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *data = view.buf;
    PyObject *result = NULL, *owner = NULL, *header = NULL;
    Lists l = {0};
    l.direct = direct;
    Header h;
    if (check_header(data, view.len, position, &h) < 0) goto done;
    if (verify) {
        uint32_t crc;
        if (crc_of(data + position + CRC_START, h.batch_length - CRC_START, &crc) < 0) goto done;
        if (crc != h.crc) {
            corrupt(position, "CRC mismatch in batch at position %zd (base offset %lld)", position,
                    (long long)h.base_offset);
            goto done;
        }
    }
    const unsigned char *payload;
    Py_ssize_t plen, base;
    int code = h.attributes & ATTR_COMPRESSION_MASK;
    if (code) {
        PyObject *mv = PyMemoryView_FromObject(src);
        PyObject *body = NULL;
        if (mv != NULL) {
            body = PyObject_CallFunction(Decompress, "iNi", code,
                                         PySequence_GetSlice(mv, position + HEADER_SIZE, position + h.batch_length),
                                         (int)h.payload_length);
        }
        Py_XDECREF(mv);
        if (body == NULL) goto done;
        if (!PyBytes_Check(body)) {
            Py_DECREF(body);
            PyErr_SetString(PyExc_TypeError, "decompress must return bytes");
            goto done;
        }
        owner = body;
        payload = (const unsigned char *)PyBytes_AS_STRING(body);
        plen = PyBytes_GET_SIZE(body);
        base = 0;
    } else {
        payload = data + position + HEADER_SIZE;
        plen = h.batch_length - HEADER_SIZE;
        base = position + HEADER_SIZE;
        if (plen != h.payload_length) {
            corrupt(position, "payload length mismatch at position %zd", position);
            goto done;
        }
    }
    if (decode_payload(&h, payload, plen, &l) < 0) {
        add_position(position);
        goto done;
    }
    if (direct != NULL) {
        result = direct->kind == 1 ? header_tuple(&h) : Py_NewRef(Py_None);
        goto done;
    }
    header = header_tuple(&h);
    if (header == NULL) goto done;
    PyObject *value_data;
    if (l.values_null) {
        value_data = Py_NewRef(Py_None);
    } else {
        PyObject *mv = PyMemoryView_FromObject(owner ? owner : src);
        value_data = mv ? PySequence_GetSlice(mv, base + l.value_start, base + l.value_end) : NULL;
        Py_XDECREF(mv);
        if (value_data == NULL) goto done;
    }
    result = PyTuple_Pack(9, header, l.offsets, l.timestamps, l.keys, l.values, l.headers, l.ksizes, l.vsizes,
                          value_data);
    Py_DECREF(value_data);
done:
    lists_clear(&l);
    Py_XDECREF(header);
    Py_XDECREF(owner);
    PyBuffer_Release(&view);
    return result;
}

/* --- building consumer records ------------------------------------------------------------------------- */
PyDoc_STRVAR(build_records_doc,
"build_records(cls, topic, partition, timestamp_type, offsets, timestamps, keys, values, headers,\n"
"    key_sizes, value_sizes, header_sizes) -> list\n\n"
"One ``cls`` tuple (pylog.structs.ConsumerRecord) per record, fields in ConsumerRecord's order with\n"
"leader_epoch -1 and checksum None; ``header_sizes`` None means -1 for every record. The lists must have one\n"
"entry per record.");

static PyObject *build_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "build_records takes 12 arguments");
        return NULL;
    }
    PyObject *cls = args[0], *topic = args[1], *partition = args[2], *ts_type = args[3];
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "cls must be a tuple subclass");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    PyObject *cols[8];
    Py_ssize_t n = -1;
    for (int i = 0; i < 8; i++) {
        PyObject *c = args[4 + i];
        if (i == 7 && c == Py_None) {
            cols[i] = NULL;
            continue;
        }
        if (!PyList_Check(c)) {
            PyErr_SetString(PyExc_TypeError, "build_records: the columns must be lists");
            return NULL;
        }
        if (n < 0) n = PyList_GET_SIZE(c);
        if (PyList_GET_SIZE(c) != n) {
            PyErr_SetString(PyExc_ValueError, "build_records: the columns differ in length");
            return NULL;
        }
        cols[i] = c;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    PyObject *minus1 = PyLong_FromLong(-1);
    if (minus1 == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = type->tp_alloc(type, RECORD_FIELDS);
        if (r == NULL) {
            Py_DECREF(out);
            Py_DECREF(minus1);
            return NULL;
        }
        PyObject *const fields[RECORD_FIELDS] = {
            topic,
            partition,
            minus1,
            PyList_GET_ITEM(cols[0], i),
            PyList_GET_ITEM(cols[1], i),
            ts_type,
            PyList_GET_ITEM(cols[2], i),
            PyList_GET_ITEM(cols[3], i),
            PyList_GET_ITEM(cols[4], i),
            Py_None,
            PyList_GET_ITEM(cols[5], i),
            PyList_GET_ITEM(cols[6], i),
            cols[7] ? PyList_GET_ITEM(cols[7], i) : minus1,
        };
        for (int f = 0; f < RECORD_FIELDS; f++) PyTuple_SET_ITEM(r, f, Py_NewRef(fields[f]));
        PyList_SET_ITEM(out, i, r);
    }
    Py_DECREF(minus1);
    return out;
}

/* --- encoding a run of records into a batch --------------------------------------------------------------- */
static int width_unsigned(uint64_t v) { return v < (1u << 8) ? 1 : v < (1u << 16) ? 2 : v < (1ull << 32) ? 4 : 8; }
static int width_signed(int64_t v) { return v < (1 << 7) ? 1 : v < (1 << 15) ? 2 : 4; }

/* Length of a key or value (-1 for None); -2 when it is not bytes (the pure-Python encoder takes it). */
static inline int64_t item_length(PyObject *o) {
    if (o == Py_None) return -1;
    if (!PyBytes_Check(o)) return -2;
    return PyBytes_GET_SIZE(o);
}

PyDoc_STRVAR(encode_batch_doc,
"encode_batch(base_offset, keys, values, timestamps, headers, attributes, producer_id, producer_epoch,\n"
"    base_sequence, as_bytearray) -> bytes | bytearray | NotImplemented\n\n"
"pylog.record.encode_batch for dense offsets: keys and values lists of bytes or None, timestamps a list of\n"
"ints, headers None or a list of encoded header blobs. NotImplemented for any input it does not take (not\n"
"bytes, lengths beyond the columns' widths): the pure-Python encoder handles those.");

static PyObject *encode_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "encode_batch takes 10 arguments");
        return NULL;
    }
    if (!configured()) return NULL;
    PyObject *keys = args[1], *values = args[2], *tss = args[3], *headers = args[4];
    if (!PyList_Check(keys) || !PyList_Check(values) || !PyList_Check(tss) ||
        (headers != Py_None && !PyList_Check(headers)))
        Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (n < 1 || n > MAX_RECORDS || PyList_GET_SIZE(values) != n || PyList_GET_SIZE(tss) != n ||
        (headers != Py_None && PyList_GET_SIZE(headers) != n))
        Py_RETURN_NOTIMPLEMENTED;
    long long base_offset = PyLong_AsLongLong(args[0]);
    long attributes = PyLong_AsLong(args[5]);
    long long producer_id = PyLong_AsLongLong(args[6]);
    long producer_epoch = PyLong_AsLong(args[7]);
    long base_sequence = PyLong_AsLong(args[8]);
    int as_bytearray = PyObject_IsTrue(args[9]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    /* pass 1: widths and sizes */
    int64_t ts_min = 0, ts_max = 0, key_max = -1, value_max = -1;
    uint64_t header_max = 0;
    int64_t key_total = 0, value_total = 0, header_total = 0;
    int any_header = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(tss, i);
        int overflow = 0;
        long long ts = PyLong_Check(t) ? PyLong_AsLongLongAndOverflow(t, &overflow) : 0;
        if (!PyLong_Check(t) || overflow || (ts == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            Py_RETURN_NOTIMPLEMENTED;
        }
        if (i == 0 || ts < ts_min) ts_min = ts;
        if (i == 0 || ts > ts_max) ts_max = ts;
        int64_t kl = item_length(PyList_GET_ITEM(keys, i)), vl = item_length(PyList_GET_ITEM(values, i));
        if (kl == -2 || vl == -2 || kl > INT32_MAX || vl > INT32_MAX) Py_RETURN_NOTIMPLEMENTED;
        if (kl > key_max) key_max = kl;
        if (vl > value_max) value_max = vl;
        if (kl > 0) key_total += kl;
        if (vl > 0) value_total += vl;
        if (headers != Py_None) {
            PyObject *h = PyList_GET_ITEM(headers, i);
            if (!PyBytes_Check(h)) Py_RETURN_NOTIMPLEMENTED;
            uint64_t hl = (uint64_t)PyBytes_GET_SIZE(h);
            if (hl > UINT32_MAX) Py_RETURN_NOTIMPLEMENTED;
            if (hl) any_header = 1;
            if (hl > header_max) header_max = hl;
            header_total += (int64_t)hl;
        }
    }
    uint64_t span = (uint64_t)ts_max - (uint64_t)ts_min;
    int ts_w = span == 0 ? 0 : width_unsigned(span);
    int key_w = width_signed(key_max), value_w = width_signed(value_max);
    int header_w = any_header ? (width_unsigned(header_max) > 4 ? 4 : width_unsigned(header_max)) : 0;
    int64_t payload_len = LAYOUT_SIZE + (int64_t)n * (ts_w + key_w + value_w + header_w) + key_total +
                          value_total + (any_header ? header_total : 0);
    if (payload_len > INT32_MAX - HEADER_SIZE) Py_RETURN_NOTIMPLEMENTED;
    int code = (int)(attributes & ATTR_COMPRESSION_MASK);
    /* pass 2: the payload, written in place after the header when uncompressed */
    PyObject *out = NULL, *payload_obj = NULL;
    unsigned char *payload;
    if (code == 0) {
        out = as_bytearray ? PyByteArray_FromStringAndSize(NULL, HEADER_SIZE + payload_len)
                           : PyBytes_FromStringAndSize(NULL, HEADER_SIZE + payload_len);
        if (out == NULL) return NULL;
        unsigned char *base = (unsigned char *)(as_bytearray ? PyByteArray_AS_STRING(out) : PyBytes_AS_STRING(out));
        payload = base + HEADER_SIZE;
    } else {
        payload_obj = PyBytes_FromStringAndSize(NULL, payload_len);
        if (payload_obj == NULL) return NULL;
        payload = (unsigned char *)PyBytes_AS_STRING(payload_obj);
    }
    payload[0] = (unsigned char)ts_w;
    payload[1] = 0;
    payload[2] = (unsigned char)key_w;
    payload[3] = (unsigned char)value_w;
    payload[4] = (unsigned char)header_w;
    payload[5] = payload[6] = payload[7] = 0;
    unsigned char *at = payload + LAYOUT_SIZE;
    if (ts_w) {
        for (Py_ssize_t i = 0; i < n; i++, at += ts_w)
            wr_u(at, (uint64_t)PyLong_AsLongLong(PyList_GET_ITEM(tss, i)) - (uint64_t)ts_min, ts_w);
    }
    for (Py_ssize_t i = 0; i < n; i++, at += key_w) wr_u(at, (uint64_t)item_length(PyList_GET_ITEM(keys, i)), key_w);
    for (Py_ssize_t i = 0; i < n; i++, at += value_w)
        wr_u(at, (uint64_t)item_length(PyList_GET_ITEM(values, i)), value_w);
    if (header_w) {
        for (Py_ssize_t i = 0; i < n; i++, at += header_w)
            wr_u(at, (uint64_t)PyBytes_GET_SIZE(PyList_GET_ITEM(headers, i)), header_w);
    }
    PyObject *cols[3] = {keys, values, header_w ? headers : NULL};
    for (int c = 0; c < 3; c++) {
        if (cols[c] == NULL) continue;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *o = PyList_GET_ITEM(cols[c], i);
            if (o == Py_None) continue;
            Py_ssize_t len = PyBytes_GET_SIZE(o);
            memcpy(at, PyBytes_AS_STRING(o), (size_t)len);
            at += len;
        }
    }
    int64_t body_len = payload_len;
    if (code) {
        PyObject *packed = PyObject_CallFunction(Compress, "iO", code, payload_obj);
        Py_DECREF(payload_obj);
        if (packed == NULL) return NULL;
        if (!PyBytes_Check(packed)) {
            Py_DECREF(packed);
            PyErr_SetString(PyExc_TypeError, "compress must return bytes");
            return NULL;
        }
        body_len = PyBytes_GET_SIZE(packed);
        if (body_len > INT32_MAX - HEADER_SIZE) {
            Py_DECREF(packed);
            Py_RETURN_NOTIMPLEMENTED;
        }
        out = as_bytearray ? PyByteArray_FromStringAndSize(NULL, HEADER_SIZE + body_len)
                           : PyBytes_FromStringAndSize(NULL, HEADER_SIZE + body_len);
        if (out != NULL) {
            unsigned char *base =
                (unsigned char *)(as_bytearray ? PyByteArray_AS_STRING(out) : PyBytes_AS_STRING(out));
            memcpy(base + HEADER_SIZE, PyBytes_AS_STRING(packed), (size_t)body_len);
        }
        Py_DECREF(packed);
        if (out == NULL) return NULL;
    }
    unsigned char *h = (unsigned char *)(as_bytearray ? PyByteArray_AS_STRING(out) : PyBytes_AS_STRING(out));
    wr_u(h + 0, (uint64_t)base_offset, 8);
    wr_u(h + 8, (uint64_t)(HEADER_SIZE + body_len), 4);
    wr_u(h + 12, 0, 4);
    h[16] = MAGIC;
    h[17] = 0;
    wr_u(h + 18, (uint64_t)attributes, 2);
    wr_u(h + 20, (uint64_t)(n - 1), 4);
    wr_u(h + 24, (uint64_t)ts_min, 8);
    wr_u(h + 32, (uint64_t)ts_max, 8);
    wr_u(h + 40, (uint64_t)producer_id, 8);
    wr_u(h + 48, (uint64_t)producer_epoch, 2);
    wr_u(h + 50, 0, 2);
    wr_u(h + 52, (uint64_t)base_sequence, 4);
    wr_u(h + 56, (uint64_t)n, 4);
    wr_u(h + 60, (uint64_t)payload_len, 4);
    uint32_t crc;
    if (crc_of(h + CRC_START, HEADER_SIZE + body_len - CRC_START, &crc) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    wr_u(h + 12, crc, 4);
    return out;
}

/* --- Kafka record batch v2 records <-> columns (the broker's translation, pylog/broker/records.py) --------- */
/* The records section of a Kafka batch (the byte table is in pylog/broker/records.py): per record a zigzag
 * varint length, an attributes byte, varlong timestamp delta, varint offset delta, key and value (varint
 * length, -1 for null, then the bytes), varint header count and headers. */

/* A zigzag varint at *pos (at most 10 bytes). 0 and the value, 1 past the end or too long (malformed),
 * 2 when it does not fit 64 bits (left to the pure-Python reader). */
static inline int rd_varint(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos, int64_t *out) {
    uint64_t result = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*pos >= end) return 1;
        unsigned char b = p[(*pos)++];
        if (shift == 63 && b > 1) return 2;
        result |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = (int64_t)(result >> 1) ^ -(int64_t)(result & 1);
            return 0;
        }
    }
    return 1;
}

#define KAFKA_BAD(...)                                                                                         \
    do {                                                                                                       \
        PyErr_Format(PyExc_ValueError, __VA_ARGS__);                                                           \
        goto fail;                                                                                             \
    } while (0)
#define KAFKA_VARINT(var)                                                                                      \
    do {                                                                                                       \
        int rc_ = rd_varint(p, end, &pos, &(var));                                                             \
        if (rc_ == 2) goto not_implemented;                                                                    \
        if (rc_) KAFKA_BAD("record %zd: a varint runs past the batch or is longer than 10 bytes", i);         \
    } while (0)

PyDoc_STRVAR(kafka_decode_records_doc,
"kafka_decode_records(raw, count, base_timestamp) -> (timestamps, keys, values, headers or None)\n\n"
"pylog.broker.records._records in C. ValueError for malformed records; NotImplemented for values beyond\n"
"64 bits (the pure-Python reader handles those).");

static PyObject *kafka_decode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "kafka_decode_records(raw, count, base_timestamp)");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    long long base_ts = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t end = view.len, pos = 0, i = 0;
    /* headers: made at the first record that has some (earlier records get empty lists then), so that a
     * batch without headers allocates no list per record */
    PyObject *tss = PyList_New(0), *keys = PyList_New(0), *values = PyList_New(0), *headers = NULL;
    PyObject *result = NULL;
    int any_headers = 0;
    if (!tss || !keys || !values) goto fail;
    for (i = 0; i < count; i++) {
        int64_t length, ts_delta, offset_delta, n;
        KAFKA_VARINT(length);
        Py_ssize_t stop = pos + (Py_ssize_t)length; /* |length| < 2^63; pos < 2^62 */
        if (length > (int64_t)(end - pos)) KAFKA_BAD("record %zd of %lld bytes runs past the batch", i, (long long)length);
        if (pos >= end) KAFKA_BAD("record %zd: no attributes byte", i);
        pos++; /* attributes, unused */
        KAFKA_VARINT(ts_delta);
        KAFKA_VARINT(offset_delta);
        if (offset_delta != i) KAFKA_BAD("record %zd has offset delta %lld", i, (long long)offset_delta);
        PyObject *cols[2] = {keys, values};
        for (int c = 0; c < 2; c++) {
            KAFKA_VARINT(n);
            PyObject *item;
            if (n < 0) {
                item = Py_NewRef(Py_None);
            } else {
                if (n > (int64_t)(end - pos)) KAFKA_BAD("record %zd: a key or value runs past the batch", i);
                item = PyBytes_FromStringAndSize((const char *)p + pos, (Py_ssize_t)n);
                if (item == NULL) goto fail;
                pos += (Py_ssize_t)n;
            }
            int rc = PyList_Append(cols[c], item);
            Py_DECREF(item);
            if (rc < 0) goto fail;
        }
        if (pos >= end) KAFKA_BAD("record %zd: no header count", i);
        if (p[pos] != 0 && headers == NULL) {
            headers = PyList_New(i);
            if (headers == NULL) goto fail;
            for (Py_ssize_t j = 0; j < i; j++) {
                PyObject *empty = PyList_New(0);
                if (empty == NULL) goto fail;
                PyList_SET_ITEM(headers, j, empty);
            }
        }
        PyObject *pairs = NULL;
        if (headers != NULL && (pairs = PyList_New(0)) == NULL) goto fail;
        if (p[pos] == 0) {
            pos++;
        } else {
            int64_t hn;
            int rc_ = rd_varint(p, end, &pos, &hn);
            if (rc_ == 2) {
                Py_DECREF(pairs);
                goto not_implemented;
            }
            if (rc_ || hn < 0) {
                Py_DECREF(pairs);
                KAFKA_BAD("record %zd: bad header count", i);
            }
            any_headers = 1;
            for (int64_t k = 0; k < hn; k++) {
                int64_t kn, vn;
                int r1 = rd_varint(p, end, &pos, &kn);
                if (r1 == 0 && (kn < 0 || kn > (int64_t)(end - pos))) r1 = 1;
                PyObject *key = r1 ? NULL : PyUnicode_DecodeUTF8((const char *)p + pos, (Py_ssize_t)kn, "strict");
                if (key == NULL) {
                    Py_DECREF(pairs);
                    if (r1 == 2) goto not_implemented;
                    if (r1) KAFKA_BAD("record %zd: a header key is null or runs past the batch", i);
                    goto fail; /* UnicodeDecodeError, a ValueError */
                }
                pos += (Py_ssize_t)kn;
                int r2 = rd_varint(p, end, &pos, &vn);
                if (r2 == 0 && vn > (int64_t)(end - pos)) r2 = 1;
                PyObject *value = r2 ? NULL : vn < 0 ? Py_NewRef(Py_None)
                                                     : PyBytes_FromStringAndSize((const char *)p + pos, (Py_ssize_t)vn);
                if (value == NULL) {
                    Py_DECREF(key);
                    Py_DECREF(pairs);
                    if (r2 == 2) goto not_implemented;
                    if (r2) KAFKA_BAD("record %zd: a header value runs past the batch", i);
                    goto fail;
                }
                if (vn > 0) pos += (Py_ssize_t)vn;
                PyObject *pair = PyTuple_Pack(2, key, value);
                Py_DECREF(key);
                Py_DECREF(value);
                if (pair == NULL || PyList_Append(pairs, pair) < 0) {
                    Py_XDECREF(pair);
                    Py_DECREF(pairs);
                    goto fail;
                }
                Py_DECREF(pair);
            }
        }
        if (pairs != NULL) {
            int rc = PyList_Append(headers, pairs);
            Py_DECREF(pairs);
            if (rc < 0) goto fail;
        }
        if (pos != stop) KAFKA_BAD("record %zd is %lld bytes long but its fields are %lld", i, (long long)length,
                                   (long long)(pos - stop + length));
        int64_t ts;
        if (__builtin_add_overflow((int64_t)base_ts, ts_delta, &ts)) goto not_implemented;
        PyObject *t = PyLong_FromLongLong(ts);
        if (t == NULL || PyList_Append(tss, t) < 0) {
            Py_XDECREF(t);
            goto fail;
        }
        Py_DECREF(t);
    }
    if (pos != end) KAFKA_BAD("%zd bytes after the batch's %zd records", end - pos, count);
    result = PyTuple_Pack(4, tss, keys, values, any_headers && headers ? headers : Py_None);
    goto fail; /* releases everything but the result */
not_implemented:
    result = Py_NewRef(Py_NotImplemented);
fail:
    Py_XDECREF(tss);
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(headers);
    PyBuffer_Release(&view);
    return result;
}

static inline int varint_size(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline unsigned char *wr_varint(unsigned char *out, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (z >= 0x80) {
        *out++ = (unsigned char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    *out++ = (unsigned char)z;
    return out;
}

/* One record's fields after its length (the body), as sizes; -1 when an input is not of the expected types
 * (NotImplemented), -2 with an exception set. */
static int64_t kafka_body_size(int64_t ts_delta, int64_t offset_delta, PyObject *key, PyObject *value,
                               PyObject *hdrs) {
    int64_t size = 1 + varint_size(ts_delta) + varint_size(offset_delta);
    PyObject *kv[2] = {key, value};
    for (int c = 0; c < 2; c++) {
        if (kv[c] == Py_None)
            size += 1;
        else if (PyBytes_Check(kv[c]))
            size += varint_size(PyBytes_GET_SIZE(kv[c])) + PyBytes_GET_SIZE(kv[c]);
        else
            return -1;
    }
    if (!PyList_Check(hdrs)) return -1;
    Py_ssize_t hn = PyList_GET_SIZE(hdrs);
    size += varint_size(hn);
    for (Py_ssize_t j = 0; j < hn; j++) {
        PyObject *pair = PyList_GET_ITEM(hdrs, j);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)))
            return -1;
        Py_ssize_t kl;
        if (PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &kl) == NULL) return -2;
        PyObject *v = PyTuple_GET_ITEM(pair, 1);
        size += varint_size(kl) + kl;
        if (v == Py_None)
            size += 1;
        else if (PyBytes_Check(v))
            size += varint_size(PyBytes_GET_SIZE(v)) + PyBytes_GET_SIZE(v);
        else
            return -1;
    }
    return size;
}

static unsigned char *kafka_write_bytes(unsigned char *out, PyObject *o) {
    if (o == Py_None) {
        *out++ = 0x01; /* zigzag -1 */
        return out;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(o);
    out = wr_varint(out, n);
    memcpy(out, PyBytes_AS_STRING(o), (size_t)n);
    return out + n;
}

PyDoc_STRVAR(kafka_encode_records_doc,
"kafka_encode_records(base_offset, base_timestamp, offsets, timestamps, keys, values, headers) -> bytes\n\n"
"The records section of the Kafka batch pylog.broker.records.encode_batch builds for these records (lists;\n"
"headers: per record a list of (str, bytes | None) pairs). NotImplemented for other types or for deltas\n"
"beyond 64 bits (the pure-Python writer handles those).");

static PyObject *kafka_encode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "kafka_encode_records takes 7 arguments");
        return NULL;
    }
    long long base = PyLong_AsLongLong(args[0]), base_ts = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *offs = args[2], *tss = args[3], *keys = args[4], *values = args[5], *hdrs = args[6];
    if (!PyList_Check(offs) || !PyList_Check(tss) || !PyList_Check(keys) || !PyList_Check(values) ||
        !PyList_Check(hdrs))
        Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t n = PyList_GET_SIZE(offs);
    if (PyList_GET_SIZE(tss) != n || PyList_GET_SIZE(keys) != n || PyList_GET_SIZE(values) != n ||
        PyList_GET_SIZE(hdrs) != n)
        Py_RETURN_NOTIMPLEMENTED;
    int64_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        PyObject *out = NULL;
        unsigned char *w = NULL;
        if (pass == 1) {
            if (total > PY_SSIZE_T_MAX / 2) Py_RETURN_NOTIMPLEMENTED;
            out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
            if (out == NULL) return NULL;
            w = (unsigned char *)PyBytes_AS_STRING(out);
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            int o1 = 0, o2 = 0;
            long long off = PyLong_Check(PyList_GET_ITEM(offs, i))
                                ? PyLong_AsLongLongAndOverflow(PyList_GET_ITEM(offs, i), &o1) : (o1 = 1, 0);
            long long ts = PyLong_Check(PyList_GET_ITEM(tss, i))
                               ? PyLong_AsLongLongAndOverflow(PyList_GET_ITEM(tss, i), &o2) : (o2 = 1, 0);
            int64_t ts_delta, offset_delta;
            if (o1 || o2 || PyErr_Occurred() || __builtin_sub_overflow((int64_t)ts, (int64_t)base_ts, &ts_delta) ||
                __builtin_sub_overflow((int64_t)off, (int64_t)base, &offset_delta)) {
                PyErr_Clear();
                Py_XDECREF(out);
                Py_RETURN_NOTIMPLEMENTED;
            }
            PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
            PyObject *h = PyList_GET_ITEM(hdrs, i);
            int64_t body = kafka_body_size(ts_delta, offset_delta, key, value, h);
            if (body < 0) {
                Py_XDECREF(out);
                if (body == -2) return NULL;
                Py_RETURN_NOTIMPLEMENTED;
            }
            if (pass == 0) {
                total += varint_size(body) + body;
                continue;
            }
            w = wr_varint(w, body);
            *w++ = 0; /* attributes */
            w = wr_varint(w, ts_delta);
            w = wr_varint(w, offset_delta);
            w = kafka_write_bytes(w, key);
            w = kafka_write_bytes(w, value);
            Py_ssize_t hn = PyList_GET_SIZE(h);
            w = wr_varint(w, hn);
            for (Py_ssize_t j = 0; j < hn; j++) {
                PyObject *pair = PyList_GET_ITEM(h, j);
                Py_ssize_t kl;
                const char *k = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &kl);
                w = wr_varint(w, kl);
                memcpy(w, k, (size_t)kl);
                w += kl;
                w = kafka_write_bytes(w, PyTuple_GET_ITEM(pair, 1));
            }
        }
        if (pass == 1) {
            if (w != (unsigned char *)PyBytes_AS_STRING(out) + total) {
                Py_DECREF(out);
                PyErr_SetString(PyExc_SystemError, "kafka_encode_records: size mismatch");
                return NULL;
            }
            return out;
        }
    }
    Py_RETURN_NONE; /* not reached */
}

/* The records section of the Kafka batch for a checked pylog payload (pylog/broker/records.py's encode_batch
 * of its decode_lists, without the Python objects in between): d->out gets the bytes. Records with headers
 * go through their Python objects (read as decode_lists reads them); anything the C writer does not take
 * (a timestamp delta beyond int64, headers not as encode_headers writes them) sets d->not_implemented. */
static int kafka_record_size(const Header *h, int64_t tsd, int64_t offd, int64_t kl, int64_t vl, PyObject *hv,
                             int64_t *body) {
    int64_t b = 1 + varint_size(tsd) + varint_size(offd);
    b += kl < 0 ? 1 : varint_size(kl) + kl;
    b += vl < 0 ? 1 : varint_size(vl) + vl;
    if (hv == NULL) {
        b += 1;
    } else {
        /* the headers part, as kafka_body_size counts it: the attributes byte, the two one-byte deltas and
         * the two null lengths it adds for (0, 0, None, None) are 5 bytes */
        int64_t full = kafka_body_size(0, 0, Py_None, Py_None, hv);
        if (full < 0) return (int)full;
        b += full - 5;
    }
    *body = b;
    return 0;
}

static int build_kafka(const Header *h, const unsigned char *payload, Py_ssize_t at, int64_t key_total,
                       int64_t value_total, const unsigned char *ts_col, int ts_w, const unsigned char *delta_col,
                       int delta_w, const unsigned char *key_col, int key_w, const unsigned char *value_col,
                       int value_w, const unsigned char *header_col, int header_w, Direct *d) {
    Py_ssize_t n = h->record_count;
    PyObject **hvs = NULL; /* per record its headers list, NULL for none */
    if (header_col != NULL) {
        hvs = PyMem_Calloc((size_t)n, sizeof(PyObject *));
        if (hvs == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    int rc = -1;
    PyObject *out = NULL;
    Py_ssize_t hat = at + (Py_ssize_t)(key_total + value_total);
    for (Py_ssize_t i = 0; hvs && i < n; i++) {
        Py_ssize_t hl = (Py_ssize_t)rd_u(header_col + i * header_w, header_w);
        if (hl) {
            hvs[i] = fast_headers(payload + hat, hl);
            if (hvs[i] == NULL) { /* not the form encode_headers writes: the Python path decides */
                d->not_implemented = 1;
                rc = 0;
                goto done;
            }
        }
        hat += hl;
    }
    for (int pass = 0; pass < 2; pass++) {
        int64_t total = 0;
        unsigned char *w = out ? (unsigned char *)PyBytes_AS_STRING(out) : NULL;
        Py_ssize_t kat = at, vat = at + (Py_ssize_t)key_total;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t tsd_u = ts_w ? rd_u(ts_col + i * ts_w, ts_w) : 0;
            if (tsd_u > (uint64_t)INT64_MAX) {
                d->not_implemented = 1;
                rc = 0;
                goto done;
            }
            int64_t tsd = (int64_t)tsd_u, offd = delta_w ? (int64_t)rd_u(delta_col + i * delta_w, delta_w) : i;
            int64_t kl = rd_s(key_col + i * key_w, key_w), vl = rd_s(value_col + i * value_w, value_w);
            PyObject *hv = hvs ? hvs[i] : NULL;
            int64_t body = 0;
            int r = kafka_record_size(h, tsd, offd, kl, vl, hv, &body);
            if (r == -2) goto done;
            if (r < 0) {
                d->not_implemented = 1;
                rc = 0;
                goto done;
            }
            if (pass == 0) {
                total += varint_size(body) + body;
                continue;
            }
            w = wr_varint(w, body);
            *w++ = 0; /* attributes */
            w = wr_varint(w, tsd);
            w = wr_varint(w, offd);
            if (kl < 0) {
                *w++ = 0x01;
            } else {
                w = wr_varint(w, kl);
                memcpy(w, payload + kat, (size_t)kl);
                w += kl;
                kat += (Py_ssize_t)kl;
            }
            if (vl < 0) {
                *w++ = 0x01;
            } else {
                w = wr_varint(w, vl);
                memcpy(w, payload + vat, (size_t)vl);
                w += vl;
                vat += (Py_ssize_t)vl;
            }
            if (hv == NULL) {
                *w++ = 0;
            } else {
                Py_ssize_t hn = PyList_GET_SIZE(hv);
                w = wr_varint(w, hn);
                for (Py_ssize_t j = 0; j < hn; j++) {
                    PyObject *pair = PyList_GET_ITEM(hv, j);
                    Py_ssize_t kl2;
                    const char *k = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &kl2);
                    w = wr_varint(w, kl2);
                    memcpy(w, k, (size_t)kl2);
                    w += kl2;
                    w = kafka_write_bytes(w, PyTuple_GET_ITEM(pair, 1));
                }
            }
        }
        if (pass == 0) {
            if (total > PY_SSIZE_T_MAX / 2) {
                d->not_implemented = 1;
                rc = 0;
                goto done;
            }
            out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
            if (out == NULL) goto done;
        } else if (w != (unsigned char *)PyBytes_AS_STRING(out) + PyBytes_GET_SIZE(out)) {
            PyErr_SetString(PyExc_SystemError, "kafka_from_pylog: size mismatch");
            goto done;
        }
    }
    d->out = out;
    out = NULL;
    rc = 0;
done:
    Py_XDECREF(out);
    for (Py_ssize_t i = 0; hvs && i < n; i++) Py_XDECREF(hvs[i]);
    PyMem_Free(hvs);
    return rc;
}

PyDoc_STRVAR(kafka_from_pylog_doc,
"kafka_from_pylog(buf, position) -> (header, records) | NotImplemented\n\n"
"The pylog batch at ``position`` (every check of decode_lists) and the records section of the Kafka batch\n"
"pylog/broker/records.py's encode_batch writes for it, without Python objects per record.\n"
"NotImplemented for what the C writer leaves to that Python code.");

static PyObject *kafka_from_pylog(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "kafka_from_pylog(buf, position)");
        return NULL;
    }
    if (!configured()) return NULL;
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    if (position == -1 && PyErr_Occurred()) return NULL;
    Direct d = {NULL, NULL, NULL, 0, NULL, 1, 0};
    PyObject *header = decode_impl(args[0], position, 1, &d);
    if (header == NULL) {
        Py_XDECREF(d.out);
        return NULL;
    }
    if (d.not_implemented || d.out == NULL) {
        Py_DECREF(header);
        Py_XDECREF(d.out);
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *result = PyTuple_Pack(2, header, d.out);
    Py_DECREF(header);
    Py_DECREF(d.out);
    return result;
}

/* --- configuration --------------------------------------------------------------------------------------- */
PyDoc_STRVAR(configure_doc,
"configure(batch_header, no_headers, decode_headers, crc32c, decompress, corrupt_error, unsupported_error,\n"
"    compress)\n\n"
"Called once by pylog.record with the one definition of each of these.");

static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "configure takes 8 arguments");
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "batch_header must be a tuple subclass");
        return NULL;
    }
    PyObject **slots[8] = {&BatchHeaderType, &NoHeaders,    &DecodeHeaders,    &Crc32c,
                           &Decompress,      &CorruptError, &UnsupportedError, &Compress};
    for (int i = 0; i < 8; i++) Py_XSETREF(*slots[i], Py_NewRef(args[i]));
    Py_RETURN_NONE;
}

/* --- Kafka's murmur2 (pylog/partitioner.py's murmur2 is the definition) ------------------------------------ */
PyDoc_STRVAR(murmur2_doc, "murmur2(data) -> int\n\nKafka's Utils.murmur2 of the bytes-like data, as a signed 32-bit int "
                          "(pylog.partitioner.murmur2 is the pure-Python twin).");

static PyObject *murmur2_py(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t length = view.len;
    const uint32_t m = 0x5BD1E995u;
    uint32_t h = 0x9747B28Cu ^ (uint32_t)length;
    Py_ssize_t words = length >> 2;
    for (Py_ssize_t i = 0; i < words; i++) {
        uint32_t k = (uint32_t)p[4 * i] | ((uint32_t)p[4 * i + 1] << 8) | ((uint32_t)p[4 * i + 2] << 16) |
                     ((uint32_t)p[4 * i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    Py_ssize_t tail = length & 3, at = length - tail;
    if (tail) {
        uint32_t t = 0;
        for (Py_ssize_t i = tail - 1; i >= 0; i--) t = (t << 8) | p[at + i];
        h ^= t;
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    PyBuffer_Release(&view);
    return PyLong_FromLong((long)(int32_t)h);
}

/* --- the seqlock publish of pylog/partition/state.py (whose docstring holds the byte table) ---------------- */
#define STATE_MAGIC 0x3154415453504C50LL /* b"PLPSTAT1", little-endian */
#define STATE_MAPPED 128
#define STATE_WAITING_AT 64

PyDoc_STRVAR(state_publish_doc,
             "state_publish(map, log_end_offset, active_base_offset, active_size, layout_epoch, "
             "active_max_timestamp) -> bool\n\n"
             "PartitionState.publish_values's seqlock write into the shared map (seq odd, the five fields, magic "
             "and seq even), then a full fence and a read of the waiting flag; when a reader waits, the doorbell "
             "rings as pylog.partition.doorbell.wake does (waiting cleared, FUTEX_WAKE of every waiter on the low "
             "half of seq). Returns the new seq.");

static PyObject *state_publish(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "state_publish takes a map and 5 ints");
        return NULL;
    }
    int64_t fields[5];
    for (int i = 0; i < 5; i++) {
        fields[i] = (int64_t)PyLong_AsLongLong(args[i + 1]);
        if (fields[i] == -1 && PyErr_Occurred()) return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) return NULL;
    if (view.len < STATE_MAPPED || ((uintptr_t)view.buf & 7) != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "state_publish needs the 128-byte aligned state map");
        return NULL;
    }
    int64_t *slot = (int64_t *)view.buf;
    int64_t seq = __atomic_load_n(&slot[1], __ATOMIC_RELAXED);
    __atomic_store_n(&slot[1], seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE); /* odd seq before the fields */
    for (int i = 0; i < 5; i++) __atomic_store_n(&slot[2 + i], fields[i], __ATOMIC_RELAXED);
    __atomic_store_n(&slot[0], STATE_MAGIC, __ATOMIC_RELAXED);
    __atomic_store_n(&slot[1], seq + 2, __ATOMIC_RELEASE); /* the fields before the even seq */
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* the new seq visible before `waiting` is read */
    unsigned char *waiting = (unsigned char *)view.buf + STATE_WAITING_AT;
    if (__atomic_load_n(waiting, __ATOMIC_RELAXED)) {
        __atomic_store_n(waiting, 0, __ATOMIC_RELAXED);
#ifdef __linux__
        /* not FUTEX_PRIVATE_FLAG: the waiters are other processes mapping the same file */
        syscall(SYS_futex, (void *)&slot[1], FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
#endif
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(seq + 2);
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, configure_doc},
    {"decode_lists", (PyCFunction)(void (*)(void))decode_lists, METH_FASTCALL, decode_lists_doc},
    {"build_records", (PyCFunction)(void (*)(void))build_records, METH_FASTCALL, build_records_doc},
    {"decode_records", (PyCFunction)(void (*)(void))decode_records, METH_FASTCALL, decode_records_doc},
    {"encode_batch", (PyCFunction)(void (*)(void))encode_batch, METH_FASTCALL, encode_batch_doc},
    {"crc32c", (PyCFunction)crc32c_py, METH_O, crc32c_doc},
    {"encode_headers", (PyCFunction)encode_headers, METH_O, encode_headers_doc},
    {"kafka_decode_records", (PyCFunction)(void (*)(void))kafka_decode_records, METH_FASTCALL,
     kafka_decode_records_doc},
    {"kafka_encode_records", (PyCFunction)(void (*)(void))kafka_encode_records, METH_FASTCALL,
     kafka_encode_records_doc},
    {"kafka_from_pylog", (PyCFunction)(void (*)(void))kafka_from_pylog, METH_FASTCALL, kafka_from_pylog_doc},
    {"murmur2", (PyCFunction)murmur2_py, METH_O, murmur2_doc},
    {"state_publish", (PyCFunction)(void (*)(void))state_publish, METH_FASTCALL, state_publish_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pylog._speedups",
    "The per-record hot loops of pylog's batch format, compiled (see pylog.speedups).", -1, methods,
};

/* The version of the interface between this module and pylog.record / pylog.fetcher: pylog.speedups uses the
 * module only when it is the one it expects (an extension built from an older checkout is not used). */
#define ABI_VERSION 7

PyMODINIT_FUNC PyInit__speedups(void) {
    str_position = PyUnicode_InternFromString("position");
    if (str_position == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI_VERSION", ABI_VERSION) < 0) Py_CLEAR(m);
    return m;
}
