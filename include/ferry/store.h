/**
 * @file store.h
 * @brief Weight files: strict safetensors reading (single file or sharded with
 *        `model.safetensors.index.json`), streaming safetensors writing, and disk reads of
 *        tensors or byte ranges with `pread` or `O_DIRECT`.
 *
 * Every length and offset in a file is validated against the file before it is used; errors
 * name the file, the tensor and what was expected.
 */
#ifndef FERRY_STORE_H
#define FERRY_STORE_H

#include "ferry/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/dtype.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Largest safetensors header accepted (bytes of JSON), as the reference implementation. */
#define FERRY_ST_MAX_HEADER_BYTES (100u * 1024u * 1024u)
/** Most dimensions a tensor may have. */
#define FERRY_ST_MAX_DIMS 8
/** Alignment of buffers, offsets and lengths for O_DIRECT reads. */
#define FERRY_DIRECT_ALIGN 4096u

/** One tensor of a store. */
struct ferry_store_tensor {
  const char *name;               /**< tensor name; borrowed from the store */
  enum ferry_dtype dtype;         /**< element type */
  int32_t ndim;                   /**< number of dimensions (0 for a scalar) */
  int64_t shape[FERRY_ST_MAX_DIMS]; /**< dimensions */
  uint32_t file;                  /**< index of the file holding it (ferry_store_file_path()) */
  uint64_t offset;                /**< absolute byte offset of its data in that file */
  uint64_t nbytes;                /**< byte length of its data */
};

/** Opaque handle to an opened set of safetensors files. */
typedef struct ferry_store ferry_store;

/**
 * @brief Open and validate safetensors weights.
 * @param out receives the handle, owned by the caller (ferry_store_close()).
 * @param path a `.safetensors` file; a `model.safetensors.index.json`; or a folder holding
 *        either `model.safetensors.index.json` or `*.safetensors` files.
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND (missing file or shard); FERRY_ERR_FORMAT (any
 *         violation of the format: the message in ferry_last_error() names file, tensor and
 *         what was expected); FERRY_ERR_IO; FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_store_open(ferry_store **out, const char *path);

/** @brief Close a store and its files. Accepts NULL. */
FERRY_API void ferry_store_close(ferry_store *store);

/** @brief The last detailed error message of this store ("" if none). Borrowed. */
FERRY_API const char *ferry_store_errmsg(const ferry_store *store);

/** @brief Number of tensors across all files. */
FERRY_API size_t ferry_store_tensor_count(const ferry_store *store);

/** @brief Tensor i (sorted by file, then offset); borrowed; NULL when out of range. */
FERRY_API const struct ferry_store_tensor *ferry_store_tensor_at(const ferry_store *store, size_t i);

/** @brief Find a tensor by name; borrowed; NULL when absent. */
FERRY_API const struct ferry_store_tensor *ferry_store_find(const ferry_store *store, const char *name);

/** @brief Number of files in the store. */
FERRY_API size_t ferry_store_file_count(const ferry_store *store);

/** @brief Path of file i; borrowed; NULL when out of range. */
FERRY_API const char *ferry_store_file_path(const ferry_store *store, size_t i);

/** @brief Size in bytes of file i (0 when out of range). */
FERRY_API uint64_t ferry_store_file_size(const ferry_store *store, size_t i);

/**
 * @brief A value of the `__metadata__` object of the first file.
 * @return borrowed string, or NULL when the key is absent.
 */
FERRY_API const char *ferry_store_metadata(const ferry_store *store, const char *key);

/** Flags of ferry_store_read_range(). */
enum ferry_read_flags {
  FERRY_READ_DIRECT = 1 << 0,     /**< bypass the page cache with O_DIRECT (falls back to
                                       buffered reads + FERRY_READ_DROP_CACHE where refused) */
  FERRY_READ_DROP_CACHE = 1 << 1  /**< after a buffered read, posix_fadvise(DONTNEED) the range
                                       so the next read of it comes from the disk again */
};

/**
 * @brief Bytes of buffer needed to read [offset, offset+len) with FERRY_READ_DIRECT: the
 *        range widened to FERRY_DIRECT_ALIGN boundaries.
 */
FERRY_API uint64_t ferry_store_direct_span(uint64_t offset, uint64_t len);

/**
 * @brief Read a byte range of one file into a caller's buffer.
 *
 * Without FERRY_READ_DIRECT the bytes land at buf[0..len) (*data_shift = 0). With it, buf
 * must be aligned to FERRY_DIRECT_ALIGN and hold ferry_store_direct_span(offset, len) bytes;
 * the aligned envelope is read and the requested bytes start at buf + *data_shift. This lets
 * the engine read units that do not start on a 4 KiB boundary without a bounce copy.
 * Safe to call from several threads at once.
 * @param store the store.
 * @param file index of the file (ferry_store_file_path()).
 * @param offset absolute byte offset in the file.
 * @param len number of bytes to read.
 * @param buf destination, owned by the caller.
 * @param buf_cap capacity of buf in bytes.
 * @param flags FERRY_READ_DIRECT and/or FERRY_READ_DROP_CACHE (enum ferry_read_flags), or 0.
 * @param data_shift receives where the data starts in buf; may be NULL without DIRECT.
 * @return FERRY_OK; FERRY_ERR_RANGE if the range is outside the file; FERRY_ERR_INVALID for a
 *         misaligned buffer or too small capacity; FERRY_ERR_IO on a failed or short read.
 */
FERRY_API ferry_status ferry_store_read_range(ferry_store *store, uint32_t file, uint64_t offset, uint64_t len,
                                    void *buf, uint64_t buf_cap, unsigned flags, uint64_t *data_shift);

/**
 * @brief Read a whole tensor into buf (buffered pread).
 * @param store the store holding the tensor.
 * @param tensor a tensor of this store (ferry_store_tensor_at() or ferry_store_find()).
 * @param buf destination, owned by the caller.
 * @param buf_cap capacity of buf; must be at least tensor->nbytes.
 */
FERRY_API ferry_status ferry_store_read_tensor(ferry_store *store, const struct ferry_store_tensor *tensor,
                                     void *buf, uint64_t buf_cap);

/**
 * @brief Whether FERRY_READ_DIRECT reads really bypass the page cache on this store's files.
 *
 * Probes the first file once (opens it with O_DIRECT and reads its first aligned block); where
 * the file system refuses O_DIRECT (EINVAL, e.g. some tmpfs or network file systems) DIRECT
 * reads fall back to buffered reads followed by posix_fadvise(POSIX_FADV_DONTNEED).
 * @return 1 when O_DIRECT works, 0 when the buffered fallback is used (or the store is empty).
 */
FERRY_API int ferry_store_direct_supported(ferry_store *store);

/**
 * @brief Verify every later read of a byte range against its first read.
 *
 * With verification on, ferry_store_read_range() computes the CRC-32 of the bytes it read and
 * compares it with that of the first read of the same (file, offset, length); a mismatch is
 * read again, as a transient failure, up to the I/O policy's attempts (ferry/fault.h), then
 * fails with FERRY_ERR_IO naming the file, the offset and both checksums. Costs one CRC-32 pass
 * over every byte read.
 * @param store the store.
 * @param on 1 to verify, 0 to stop.
 */
FERRY_API void ferry_store_set_verify(ferry_store *store, int on);

/** NaN and infinite values in a store's weights (ferry_store_scan_nonfinite()). */
struct ferry_store_nonfinite {
  uint64_t values;          /**< non-finite values in every floating-point tensor */
  uint64_t tensors;         /**< tensors holding at least one */
  const char *first_tensor; /**< the first such tensor in file order (borrowed), NULL when none */
  uint32_t first_file;      /**< its file (ferry_store_file_path()) */
  uint64_t first_count;     /**< non-finite values in it */
  uint64_t first_index;     /**< element index of its first one */
};

/**
 * @brief Count the NaN and infinite values of every floating-point tensor (F32, F16, BF16, F64,
 *        F8): one buffered pass over the data. The result is kept: later calls on the same store
 *        return it without reading again. Integer tensors (packed quantized weights) are
 *        skipped; their float scales are not.
 * @param store the store.
 * @param flags FERRY_READ_DROP_CACHE to drop the pages read from the page cache behind the
 *        scan (so later "disk" reads come from the disk), or 0.
 * @param out receives the counts.
 * @return FERRY_OK (whatever was found); FERRY_ERR_IO when a read fails; FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_store_scan_nonfinite(ferry_store *store, unsigned flags, struct ferry_store_nonfinite *out);

/** Name of a model folder's manifest: the SHA-256 of each of its files, `sha256sum` format. */
#define FERRY_MANIFEST_NAME "manifest.sha256"

/**
 * @brief Write @p dir/manifest.sha256: the SHA-256 of config.json, the safetensors files and
 *        their index, one "HEX  NAME" line each (the format of `sha256sum`), sorted by name;
 *        written atomically.
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND when the folder holds no model file; FERRY_ERR_IO.
 */
FERRY_API ferry_status ferry_manifest_write(const char *dir);

/**
 * @brief Check every file of @p dir against its manifest before it is served (hot reload):
 *        each listed file must hash to its SHA-256, and every model file of the folder must be
 *        listed.
 * @param dir the model folder.
 * @param files_checked receives the number of files verified (may be NULL).
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND without a manifest or a listed file; FERRY_ERR_FORMAT
 *         naming the file whose hash differs (with both hashes), a malformed line, or a file the
 *         manifest does not list.
 */
FERRY_API ferry_status ferry_manifest_verify(const char *dir, size_t *files_checked);

/** Opaque streaming writer of one safetensors file or a sharded set. */
typedef struct ferry_store_writer ferry_store_writer;

/**
 * @brief Start writing safetensors into folder @p dir.
 *
 * Declare every tensor with ferry_store_writer_add() (in file order), then stream their data
 * with ferry_store_writer_write() in the same order, then ferry_store_writer_finish(). Files
 * are written under temporary names and renamed at finish, so a failure never leaves a
 * partial file under a final name.
 * @param dir output folder (must exist).
 * @param max_shard_bytes 0 for one `model.safetensors`; otherwise tensors are split across
 *        `model-0000i-of-0000n.safetensors` of at most this many data bytes each (a larger
 *        tensor gets a shard of its own), and `model.safetensors.index.json` is written.
 * @param out receives the writer, owned by the caller (ferry_store_writer_free()).
 */
FERRY_API ferry_status ferry_store_writer_create(ferry_store_writer **out, const char *dir, uint64_t max_shard_bytes);

/** @brief Set a `__metadata__` entry (copied). Only before the first write. */
FERRY_API ferry_status ferry_store_writer_set_metadata(ferry_store_writer *w, const char *key, const char *value);

/** @brief Declare the next tensor (name copied). Only before the first write. */
FERRY_API ferry_status ferry_store_writer_add(ferry_store_writer *w, const char *name, enum ferry_dtype dtype,
                                    int32_t ndim, const int64_t *shape);

/**
 * @brief Append data bytes; they fill the declared tensors in order and may cross tensor and
 *        shard boundaries. Writing more than declared is FERRY_ERR_RANGE.
 */
FERRY_API ferry_status ferry_store_writer_write(ferry_store_writer *w, const void *data, size_t len);

/**
 * @brief Check every declared byte was written, fsync, and move the files to their final
 *        names. FERRY_ERR_INVALID when bytes are missing.
 */
FERRY_API ferry_status ferry_store_writer_finish(ferry_store_writer *w);

/** @brief Last detailed error message of the writer. Borrowed. */
FERRY_API const char *ferry_store_writer_errmsg(const ferry_store_writer *w);

/** @brief Free a writer; an unfinished one removes its temporary files. Accepts NULL. */
FERRY_API void ferry_store_writer_free(ferry_store_writer *w);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_STORE_H */
