/* Weight format names and packed layouts: parsing "int4-g64"-style names, the size, dtype,
 * shape and blob offset of every part of a packed matrix, and the reference N-bit packing.
 * Everything that decides where a byte lives is here, so quantize.c and dequant.c agree. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "runtime/quant/quant_impl.h"

const float ferry__nf4_levels[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

/* bitsandbytes-style signed dynamic 8-bit map (create_dynamic_map(signed=True, 7 exponent
 * bits)): for each decade 10^-6..10^0, 2^i linearly spaced magnitudes of each sign, plus 0 and
 * 1; ascending. Relative precision where linear int8 would have none is what keeps one outlier
 * block from ruining the absmax of the 255 others in its level-2 block. */
const float ferry__dynamic_map[256] = {
    -0.992968738f, -0.978906274f, -0.96484375f, -0.950781226f, -0.936718762f, -0.922656238f,
    -0.908593774f, -0.89453125f, -0.880468726f, -0.866406262f, -0.852343738f, -0.838281274f,
    -0.82421875f, -0.810156226f, -0.796093762f, -0.782031238f, -0.767968774f, -0.75390625f,
    -0.739843726f, -0.725781262f, -0.711718738f, -0.697656274f, -0.68359375f, -0.669531226f,
    -0.655468762f, -0.641406238f, -0.627343774f, -0.61328125f, -0.599218726f, -0.585156262f,
    -0.571093738f, -0.557031274f, -0.54296875f, -0.528906226f, -0.514843762f, -0.500781238f,
    -0.486718744f, -0.47265625f, -0.458593756f, -0.444531262f, -0.430468738f, -0.416406244f,
    -0.40234375f, -0.388281256f, -0.374218762f, -0.360156238f, -0.346093744f, -0.33203125f,
    -0.317968756f, -0.303906262f, -0.289843738f, -0.275781244f, -0.26171875f, -0.247656256f,
    -0.233593747f, -0.219531253f, -0.205468744f, -0.19140625f, -0.177343756f, -0.163281247f,
    -0.149218753f, -0.135156244f, -0.12109375f, -0.107031249f, -0.0985937491f, -0.0957812518f,
    -0.092968747f, -0.0901562497f, -0.0873437524f, -0.0845312476f, -0.0817187503f, -0.078906253f,
    -0.0760937482f, -0.0732812509f, -0.0704687536f, -0.0676562488f, -0.0648437515f, -0.0620312504f,
    -0.0592187494f, -0.0564062484f, -0.053593751f, -0.05078125f, -0.047968749f, -0.0451562516f,
    -0.0423437506f, -0.0395312496f, -0.0367187485f, -0.0339062512f, -0.0310937501f, -0.0282812491f,
    -0.0254687499f, -0.0226562507f, -0.0198437497f, -0.0170312505f, -0.0142187504f, -0.0114062503f,
    -0.00971874967f, -0.00915625039f, -0.00859375019f, -0.00803124998f, -0.00746874977f, -0.00690625003f,
    -0.00634374982f, -0.00578125007f, -0.00521874987f, -0.00465625012f, -0.00409374991f, -0.00353124994f,
    -0.00296874996f, -0.00240624999f, -0.00184375001f, -0.00128125004f, -0.000943750027f, -0.000831249985f,
    -0.000718750001f, -0.000606250018f, -0.000493749976f, -0.000381249993f, -0.000268750009f, -0.000156249997f,
    -8.87499991e-05f, -6.62500024e-05f, -4.37499984e-05f, -2.12499999e-05f, -7.7499999e-06f, -3.24999996e-06f,
    -5.49999982e-07f, 0.0f, 5.49999982e-07f, 3.24999996e-06f, 7.7499999e-06f, 2.12499999e-05f,
    4.37499984e-05f, 6.62500024e-05f, 8.87499991e-05f, 0.000156249997f, 0.000268750009f, 0.000381249993f,
    0.000493749976f, 0.000606250018f, 0.000718750001f, 0.000831249985f, 0.000943750027f, 0.00128125004f,
    0.00184375001f, 0.00240624999f, 0.00296874996f, 0.00353124994f, 0.00409374991f, 0.00465625012f,
    0.00521874987f, 0.00578125007f, 0.00634374982f, 0.00690625003f, 0.00746874977f, 0.00803124998f,
    0.00859375019f, 0.00915625039f, 0.00971874967f, 0.0114062503f, 0.0142187504f, 0.0170312505f,
    0.0198437497f, 0.0226562507f, 0.0254687499f, 0.0282812491f, 0.0310937501f, 0.0339062512f,
    0.0367187485f, 0.0395312496f, 0.0423437506f, 0.0451562516f, 0.047968749f, 0.05078125f,
    0.053593751f, 0.0564062484f, 0.0592187494f, 0.0620312504f, 0.0648437515f, 0.0676562488f,
    0.0704687536f, 0.0732812509f, 0.0760937482f, 0.078906253f, 0.0817187503f, 0.0845312476f,
    0.0873437524f, 0.0901562497f, 0.092968747f, 0.0957812518f, 0.0985937491f, 0.107031249f,
    0.12109375f, 0.135156244f, 0.149218753f, 0.163281247f, 0.177343756f, 0.19140625f,
    0.205468744f, 0.219531253f, 0.233593747f, 0.247656256f, 0.26171875f, 0.275781244f,
    0.289843738f, 0.303906262f, 0.317968756f, 0.33203125f, 0.346093744f, 0.360156238f,
    0.374218762f, 0.388281256f, 0.40234375f, 0.416406244f, 0.430468738f, 0.444531262f,
    0.458593756f, 0.47265625f, 0.486718744f, 0.500781238f, 0.514843762f, 0.528906226f,
    0.54296875f, 0.557031274f, 0.571093738f, 0.585156262f, 0.599218726f, 0.61328125f,
    0.627343774f, 0.641406238f, 0.655468762f, 0.669531226f, 0.68359375f, 0.697656274f,
    0.711718738f, 0.725781262f, 0.739843726f, 0.75390625f, 0.767968774f, 0.782031238f,
    0.796093762f, 0.810156226f, 0.82421875f, 0.838281274f, 0.852343738f, 0.866406262f,
    0.880468726f, 0.89453125f, 0.908593774f, 0.922656238f, 0.936718762f, 0.950781226f,
    0.96484375f, 0.978906274f, 0.992968738f, 1.0f,
};

static const char *const family_names[FERRY_QFORMAT_COUNT] = {
    [FERRY_QFORMAT_FP32] = "fp32", [FERRY_QFORMAT_FP16] = "fp16", [FERRY_QFORMAT_BF16] = "bf16",
    [FERRY_QFORMAT_INT8] = "int8", [FERRY_QFORMAT_INT4] = "int4", [FERRY_QFORMAT_INT3] = "int3",
    [FERRY_QFORMAT_INT2] = "int2", [FERRY_QFORMAT_NF4] = "nf4", [FERRY_QFORMAT_GPTQ4] = "gptq4",
    [FERRY_QFORMAT_AWQ4] = "awq4", [FERRY_QFORMAT_CT4] = "ct4", [FERRY_QFORMAT_CT4F16] = "ct4f16",
    [FERRY_QFORMAT_MXFP4] = "mxfp4", [FERRY_QFORMAT_FP8B] = "fp8b",
};

#define EXPECTED_NAMES \
  "fp32, fp16, bf16, int8, int4-g<G>, int3-g<G>, int2-g<G>, nf4 or nf4-g<G> (G a multiple of 8 in 8..4096); " \
  "read-only formats of published checkpoints: gptq4-g<G>, awq4-g<G>, ct4-g<G>, ct4f16-g<G>, mxfp4, fp8b"

int ferry__quant_bits(enum ferry_qformat format) {
  switch (format) {
    case FERRY_QFORMAT_FP32: return 32;
    case FERRY_QFORMAT_FP16:
    case FERRY_QFORMAT_BF16: return 16;
    case FERRY_QFORMAT_INT8: return 8;
    case FERRY_QFORMAT_INT4:
    case FERRY_QFORMAT_NF4:
    case FERRY_QFORMAT_GPTQ4:
    case FERRY_QFORMAT_AWQ4:
    case FERRY_QFORMAT_CT4:
    case FERRY_QFORMAT_CT4F16:
    case FERRY_QFORMAT_MXFP4: return 4;
    case FERRY_QFORMAT_FP8B: return 8;
    case FERRY_QFORMAT_INT3: return 3;
    case FERRY_QFORMAT_INT2: return 2;
    case FERRY_QFORMAT_COUNT: break;
  }
  return 0;
}

static int is_grouped(enum ferry_qformat f) {
  return f == FERRY_QFORMAT_INT4 || f == FERRY_QFORMAT_INT3 || f == FERRY_QFORMAT_INT2 ||
         f == FERRY_QFORMAT_NF4 || f == FERRY_QFORMAT_GPTQ4 || f == FERRY_QFORMAT_AWQ4 ||
         f == FERRY_QFORMAT_CT4 || f == FERRY_QFORMAT_CT4F16;
}

static int group_ok(int64_t g) { return g >= 8 && g <= 4096 && g % 8 == 0; }

ferry_status ferry_quant_spec_check(const struct ferry_qspec *spec) {
  if (!spec) return ferry__fail(FERRY_ERR_INVALID, "quant: NULL format spec");
  if ((unsigned)spec->format >= FERRY_QFORMAT_COUNT)
    return ferry__fail(FERRY_ERR_INVALID, "quant: format value %d is not a ferry_qformat",
                       (int)spec->format);
  if (is_grouped(spec->format)) {
    if (!group_ok(spec->group_size))
      return ferry__fail(FERRY_ERR_INVALID,
                         "quant: %s group size %d; expected a multiple of 8 in 8..4096",
                         family_names[spec->format], (int)spec->group_size);
  } else if (spec->group_size != 0) {
    return ferry__fail(FERRY_ERR_INVALID, "quant: %s takes no group size (got %d)",
                       family_names[spec->format], (int)spec->group_size);
  }
  return FERRY_OK;
}

ferry_status ferry_quant_spec_parse(const char *text, struct ferry_qspec *out) {
  if (!text || !out) return ferry__fail(FERRY_ERR_INVALID, "quant: NULL format name");
  size_t len = strlen(text);
  const char *dash = strchr(text, '-');
  size_t flen = dash ? (size_t)(dash - text) : len;
  for (int f = 0; f < FERRY_QFORMAT_COUNT; f++) {
    const char *name = family_names[f];
    if (strlen(name) != flen || strncasecmp(text, name, flen) != 0) continue;
    struct ferry_qspec s = {.format = (enum ferry_qformat)f, .group_size = 0};
    if (!dash) {
      if (f == FERRY_QFORMAT_NF4) {
        s.group_size = FERRY_QUANT_NF4_BLOCK;
      } else if (is_grouped(s.format)) {
        return ferry__fail(FERRY_ERR_INVALID,
                           "quant: format '%s' needs a group size, e.g. '%s-g64'", text, name);
      }
      *out = s;
      return FERRY_OK;
    }
    if (!is_grouped(s.format))
      return ferry__fail(FERRY_ERR_INVALID, "quant: format '%s': %s takes no group size; expected %s",
                         text, name, EXPECTED_NAMES);
    const char *g = dash + 1;
    if (tolower((unsigned char)g[0]) != 'g' || !isdigit((unsigned char)g[1]))
      return ferry__fail(FERRY_ERR_INVALID, "quant: format '%s': expected '-g<group size>' after '%s'",
                         text, name);
    errno = 0;
    char *end = NULL;
    long v = strtol(g + 1, &end, 10);
    if (errno || *end != '\0' || !group_ok(v))
      return ferry__fail(FERRY_ERR_INVALID,
                         "quant: format '%s': group size '%s' is not a multiple of 8 in 8..4096",
                         text, g + 1);
    s.group_size = (int32_t)v;
    *out = s;
    return FERRY_OK;
  }
  return ferry__fail(FERRY_ERR_INVALID, "quant: unknown format '%s'; expected %s", text,
                     EXPECTED_NAMES);
}

char *ferry_quant_spec_name(const struct ferry_qspec *spec, char *buf, size_t size) {
  if (!buf || size == 0) return buf;
  if (!spec || (unsigned)spec->format >= FERRY_QFORMAT_COUNT) {
    snprintf(buf, size, "?");
  } else if (spec->format == FERRY_QFORMAT_NF4 && spec->group_size == FERRY_QUANT_NF4_BLOCK) {
    snprintf(buf, size, "nf4");
  } else if (is_grouped(spec->format)) {
    snprintf(buf, size, "%s-g%d", family_names[spec->format], (int)spec->group_size);
  } else {
    snprintf(buf, size, "%s", family_names[spec->format]);
  }
  return buf;
}

/* a * b into *out, failing on overflow of uint64. */
static int mul_ok(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }

static void set_part(struct ferry_qpart_desc *p, const char *suffix, enum ferry_dtype dtype,
                     int32_t ndim, int64_t d0, int64_t d1, uint64_t bytes) {
  p->suffix = suffix;
  p->dtype = dtype;
  p->ndim = ndim;
  p->shape[0] = d0;
  p->shape[1] = ndim >= 2 ? d1 : 0;
  p->bytes = bytes;
}

ferry_status ferry_quant_layout(const struct ferry_qspec *spec, int64_t rows, int64_t cols,
                                struct ferry_qlayout *out) {
  ferry_status st = ferry_quant_spec_check(spec);
  if (st != FERRY_OK) return st;
  if (!out) return ferry__fail(FERRY_ERR_INVALID, "quant: NULL layout");
  /* 2^40 per dimension keeps every product below in range of the checks that follow. */
  if (rows < 1 || cols < 1 || rows > (INT64_C(1) << 40) || cols > (INT64_C(1) << 40))
    return ferry__fail(FERRY_ERR_INVALID,
                       "quant: shape [%lld, %lld]; expected 1 <= rows, cols <= 2^40",
                       (long long)rows, (long long)cols);
  memset(out, 0, sizeof *out);
  out->spec = *spec;
  out->rows = rows;
  out->cols = cols;
  struct ferry_qpart_desc *p = out->part;
  if (ferry__quant_is_published(spec->format)) {
    char msg[256];
    if (ferry__quant_published_layout(spec, rows, cols, out, msg, sizeof msg))
      return ferry__fail(FERRY_ERR_INVALID, "quant: %s", msg);
    goto offsets;
  }
  uint64_t r = (uint64_t)rows, c = (uint64_t)cols;
  int bits = ferry__quant_bits(spec->format);
  uint64_t row_bits = c * (uint64_t)bits; /* < 2^46 */
  out->row_bytes = (row_bits + 7) / 8;
  uint64_t data_bytes, gpr = 0, ngroups = 0;
  if (!mul_ok(r, out->row_bytes, &data_bytes)) goto overflow;
  if (is_grouped(spec->format)) gpr = (c + (uint64_t)spec->group_size - 1) / (uint64_t)spec->group_size;
  if (!mul_ok(r, gpr, &ngroups)) goto overflow;
  switch (spec->format) {
    case FERRY_QFORMAT_FP32:
      set_part(&p[FERRY_QPART_DATA], "qweight", FERRY_DTYPE_F32, 2, rows, cols, data_bytes);
      break;
    case FERRY_QFORMAT_FP16:
      set_part(&p[FERRY_QPART_DATA], "qweight", FERRY_DTYPE_F16, 2, rows, cols, data_bytes);
      break;
    case FERRY_QFORMAT_BF16:
      set_part(&p[FERRY_QPART_DATA], "qweight", FERRY_DTYPE_BF16, 2, rows, cols, data_bytes);
      break;
    case FERRY_QFORMAT_INT8:
      gpr = 1;
      set_part(&p[FERRY_QPART_DATA], "qweight", FERRY_DTYPE_I8, 2, rows, cols, data_bytes);
      set_part(&p[FERRY_QPART_SCALES], "scales", FERRY_DTYPE_F32, 1, rows, 0, r * 4);
      break;
    case FERRY_QFORMAT_INT4:
    case FERRY_QFORMAT_INT3:
    case FERRY_QFORMAT_INT2:
      set_part(&p[FERRY_QPART_DATA], "qweight", FERRY_DTYPE_U8, 2, rows, (int64_t)out->row_bytes,
               data_bytes);
      set_part(&p[FERRY_QPART_SCALES], "scales", FERRY_DTYPE_F16, 2, rows, (int64_t)gpr,
               ngroups * 2);
      set_part(&p[FERRY_QPART_ZEROS], "zeros", FERRY_DTYPE_U8, 2, rows, (int64_t)gpr, ngroups);
      break;
    case FERRY_QFORMAT_NF4: {
      uint64_t nblk2 = (ngroups + FERRY_QUANT_NF4_BLOCK2 - 1) / FERRY_QUANT_NF4_BLOCK2;
      set_part(&p[FERRY_QPART_DATA], "qweight", FERRY_DTYPE_U8, 2, rows, (int64_t)out->row_bytes,
               data_bytes);
      set_part(&p[FERRY_QPART_SCALES], "absmax", FERRY_DTYPE_U8, 2, rows, (int64_t)gpr, ngroups);
      set_part(&p[FERRY_QPART_SCALES2], "absmax_scales", FERRY_DTYPE_F32, 1, (int64_t)nblk2, 0,
               nblk2 * 4);
      set_part(&p[FERRY_QPART_OFFSETS2], "absmax_offsets", FERRY_DTYPE_F32, 1, (int64_t)nblk2, 0,
               nblk2 * 4);
      break;
    }
    default:
      break;
  }
  out->groups_per_row = (int64_t)gpr;
offsets:;
  uint64_t off = 0, total = 0;
  for (int i = 0; i < FERRY_QPART_COUNT; i++) {
    if (!p[i].suffix) continue;
    p[i].offset = off;
    if (__builtin_add_overflow(total, p[i].bytes, &total)) goto overflow;
    if (__builtin_add_overflow(off, (p[i].bytes + 63) & ~(uint64_t)63, &off)) goto overflow;
  }
  out->data_bytes = p[FERRY_QPART_DATA].bytes;
  out->scale_bytes = total - out->data_bytes;
  out->total_bytes = total;
  out->blob_bytes = off;
  return FERRY_OK;
overflow:
  return ferry__fail(FERRY_ERR_RANGE, "quant: packed size of [%lld, %lld] overflows 64 bits",
                     (long long)rows, (long long)cols);
}

uint64_t ferry_quant_packed_bytes(const struct ferry_qspec *spec, int64_t rows, int64_t cols,
                                  uint64_t *data_bytes, uint64_t *scale_bytes) {
  struct ferry_qlayout l;
  if (ferry_quant_layout(spec, rows, cols, &l) != FERRY_OK) return 0;
  if (data_bytes) *data_bytes = l.data_bytes;
  if (scale_bytes) *scale_bytes = l.scale_bytes;
  return l.total_bytes;
}

void ferry_quant_view_blob(const struct ferry_qlayout *layout, const void *blob,
                           struct ferry_qview *out) {
  for (int i = 0; i < FERRY_QPART_COUNT; i++)
    out->part[i] = layout->part[i].suffix ? (const uint8_t *)blob + layout->part[i].offset : NULL;
}

void ferry_quant_out_blob(const struct ferry_qlayout *layout, void *blob, struct ferry_qout *out) {
  for (int i = 0; i < FERRY_QPART_COUNT; i++)
    out->part[i] = layout->part[i].suffix ? (uint8_t *)blob + layout->part[i].offset : NULL;
}

void ferry__quant_pack_row(int bits, const uint8_t *codes, int64_t n, uint8_t *out) {
  uint64_t nbytes = ((uint64_t)n * (uint64_t)bits + 7) / 8;
  memset(out, 0, nbytes);
  for (int64_t j = 0; j < n; j++) {
    uint64_t pos = (uint64_t)j * (uint64_t)bits;
    unsigned v = (unsigned)codes[j] << (pos & 7u);
    out[pos >> 3] |= (uint8_t)v;
    if ((pos & 7u) + (unsigned)bits > 8u) out[(pos >> 3) + 1] |= (uint8_t)(v >> 8);
  }
}

void ferry__quant_unpack_row(int bits, const uint8_t *packed, int64_t n, uint8_t *codes) {
  for (int64_t j = 0; j < n; j++) codes[j] = (uint8_t)ferry__quant_code_at(packed, bits, j);
}
