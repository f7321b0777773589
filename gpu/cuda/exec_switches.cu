/* gpu/cuda/exec_switches.cu — the plan switches into the executor's
 * configuration (gpu/cuda/exec_switches.h). */
#include "gpu/cuda/exec_switches.h"

#include "gpu/cuda/executor.h"

void sf_exec_switches_apply(const sf_exec_switches *sw, sf_net_cfg *nc)
{
    static const sf_exec_switches none = {};
    if (!sw)
        sw = &none;
    nc->no_fork = sw->no_fork;
    nc->no_fuse = sw->no_fuse;
    nc->keep_relu = sw->keep_relu;
    nc->allow_rtc = sw->allow_rtc;
    nc->no_thin = sw->no_thin;
    nc->no_patch = sw->no_patch;
    nc->no_dw = sw->no_dw;
    nc->force_dw = sw->force_dw;
    nc->no_s2d = sw->no_s2d;
    nc->no_bn_fuse = sw->no_bn_fuse;
    nc->no_lt = sw->no_lt;
    nc->no_lt_tune = sw->no_lt_tune;
    nc->no_acc = sw->no_acc;
    nc->no_share = sw->no_share;
}
