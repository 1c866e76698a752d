/* The report sections about expert routing: the predictor table with bootstrap confidence
 * intervals (predictor_ci.c) and the statistics of every routing trace the runs used or
 * recorded (routing.c, from the ROUTING_STATS_* run metadata `ferry run|sim` store). */
#ifndef FERRY_REPORTS_ROUTING_SECTIONS_H
#define FERRY_REPORTS_ROUTING_SECTIONS_H

#include "reports/report_internal.h"

ferry_status ferry__section_predictor_ci(struct report *rp);
ferry_status ferry__section_routing(struct report *rp);

#endif
