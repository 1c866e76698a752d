/**
 * @file api.h
 * @brief FERRY_API marks the functions of the public API: the only symbols libferry.so
 *        exports (the library is built with -fvisibility=hidden; internal ferry__ helpers stay
 *        inside it, and tests that call them link the static library).
 */
#ifndef FERRY_API_H
#define FERRY_API_H

#if defined(__GNUC__) || defined(__clang__)
/** Exported from the shared library. */
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

#endif /* FERRY_API_H */
