/* Status codes returned by the native layer; _status.pxd turns them into uniccl errors. */
#ifndef UNICCL_CPU_STATUS_H
#define UNICCL_CPU_STATUS_H

enum {
    UC_OK = 0,
    UC_EDTYPE,   /* dtype code is not one of uniccl's 12 */
    UC_EOP,      /* op is not SUM, PROD, MAX or MIN */
    UC_EDIVISOR, /* scale divisor < 1 */
    UC_ENOMEM,
};

#endif
