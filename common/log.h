/* Minimal leveled logging to stderr; FERRY_LOG=debug|info|warn|error sets the threshold. */
#ifndef FERRY_COMMON_LOG_H
#define FERRY_COMMON_LOG_H

enum ferry_log_level { FERRY_LOG_DEBUG, FERRY_LOG_INFO, FERRY_LOG_WARN, FERRY_LOG_ERROR };

void ferry__log(enum ferry_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define FERRY_DEBUG(...) ferry__log(FERRY_LOG_DEBUG, __VA_ARGS__)
#define FERRY_INFO(...) ferry__log(FERRY_LOG_INFO, __VA_ARGS__)
#define FERRY_WARN(...) ferry__log(FERRY_LOG_WARN, __VA_ARGS__)

#endif
