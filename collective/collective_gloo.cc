/* collective/collective_gloo.cc — collective/collective.h over Gloo (the library
 * torch.distributed uses on CPUs): TCP pairs in a full mesh, rendezvous
 * through our key-value store, ring all-reduce and one-to-all broadcast.
 * Gloo reports failures by exceptions; none crosses the C API. */
#include "collective/collective.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

/* Gloo's headers compare signed and unsigned counters (gloo/math.h's
 * reductions): quiet that here, so the build's -Werror does not depend on
 * whether they are found in a system include folder (Debian) or through
 * DEPS_PREFIX (a GPU host without the -dev packages, docs/GPU-HOSTS.md). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#pragma GCC diagnostic pop

namespace {

/* Gloo's store interface on sf_kv_store. Gloo waits for a key with no bound
 * of its own; the wait is bounded by the join timeout here, and its expiry
 * becomes an exception that sf_coll_new reports. */
class KvStore : public gloo::rendezvous::Store {
  public:
    KvStore(const sf_kv_store *kv, int world, int timeout_ms) : kv_(*kv), timeout_ms_(timeout_ms)
    {
        int keys;
        sf_coll_store_needs(world, &keys, &max_value_);
    }

    void set(const std::string &key, const std::vector<char> &data) override
    {
        const std::string k = "gloo." + key;
        if (kv_.set(kv_.ctx, k.c_str(), data.data(), data.size()) != 0)
            throw std::runtime_error("the rendezvous store refused key " + k);
        if (is_addresses(key))
            own_addresses_ = data.size();
    }

    std::vector<char> get(const std::string &key) override
    {
        const std::string k = "gloo." + key;
        std::vector<char> buf(max_value_);
        size_t len = 0;
        int rc = kv_.get(kv_.ctx, k.c_str(), buf.data(), buf.size(), &len, timeout_ms_);
        if (rc == 1)
            throw std::runtime_error("no rank published " + k + " in " + std::to_string(timeout_ms_ / 1000) +
                                     " s (distributed.join_timeout_s): a rank never joined");
        /* A rank's addresses of its pairs, one per rank of its job: of
         * another length than this rank's own, they are another job's size,
         * which Gloo would only report as a failed size check. */
        if (rc == 0 && is_addresses(key) && own_addresses_ && len != own_addresses_)
            throw std::runtime_error("rank " + key + " published the addresses of a job of another size (" +
                                     std::to_string(len) + " bytes, this rank's " +
                                     std::to_string(own_addresses_) +
                                     "): every rank needs the same distributed.world_size");
        if (rc != 0 || len > buf.size())
            throw std::runtime_error("the rendezvous store failed to return " + k);
        buf.resize(len);
        return buf;
    }

    void wait(const std::vector<std::string> &keys) override { wait(keys, std::chrono::milliseconds(timeout_ms_)); }

    void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &) override
    {
        for (const auto &key : keys)
            (void)get(key);
    }

  private:
    /* connectFullMesh publishes a rank's pair addresses under its number. */
    static bool is_addresses(const std::string &key)
    {
        return !key.empty() && key.find_first_not_of("0123456789") == std::string::npos;
    }

    sf_kv_store kv_;
    int timeout_ms_;
    size_t max_value_;
    size_t own_addresses_ = 0;
};

void fill_err(char *err, size_t errlen, const char *what, const std::exception &e)
{
    if (err && errlen)
        std::snprintf(err, errlen, "%s: %s", what, e.what());
}

template <typename T> void set_reduce(gloo::AllreduceOptions &o, sf_coll_op op)
{
    void (*fn)(void *, const void *, const void *, size_t);
    switch (op) {
    case SF_COLL_MIN: fn = &gloo::min<T>; break;
    case SF_COLL_MAX: fn = &gloo::max<T>; break;
    default: fn = &gloo::sum<T>; break;
    }
    o.setReduceFunction(fn);
}

template <typename T>
void run_allreduce(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t count, sf_coll_op op,
                   std::chrono::milliseconds timeout, uint32_t tag)
{
    gloo::AllreduceOptions o(ctx);
    o.setOutput(static_cast<T *>(buf), count);
    set_reduce<T>(o, op);
    o.setTimeout(timeout);
    o.setTag(tag);
    gloo::allreduce(o);
}

} // namespace

/* connectFullMesh: each rank publishes its host name (gloo.rank_N) and one
 * value with its pairs' addresses, one per rank of the job (gloo.N). */
extern "C" void sf_coll_store_needs(int world, int *keys, size_t *value_bytes)
{
    *keys = 2 * world;
    *value_bytes = gloo::transport::tcp::Address().bytes().size() * (size_t)world;
}

struct sf_coll {
    int rank, world;
    std::chrono::milliseconds timeout;
    std::shared_ptr<gloo::transport::Device> dev;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    uint32_t tag;
};

extern "C" sf_coll *sf_coll_new(int rank, int world, const char *host, const sf_kv_store *store, int timeout_ms,
                                char *err, size_t errlen)
{
    if (world < 1 || rank < 0 || rank >= world || !store || timeout_ms <= 0) {
        std::snprintf(err, errlen, "collective: rank %d of world %d is invalid", rank, world);
        return nullptr;
    }
    try {
        auto c = std::make_unique<sf_coll>();
        c->rank = rank;
        c->world = world;
        c->timeout = std::chrono::milliseconds(timeout_ms);
        c->tag = 0;
        gloo::transport::tcp::attr attr;
        if (host && *host)
            attr.hostname = host;
        else {
            char name[256] = "";
            gethostname(name, sizeof name - 1);
            attr.hostname = name;
        }
        c->dev = gloo::transport::tcp::CreateDevice(attr);
        c->ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
        c->ctx->setTimeout(c->timeout);
        KvStore kv(store, world, timeout_ms);
        c->ctx->connectFullMesh(kv, c->dev);
        return c.release();
    } catch (const std::exception &e) {
        fill_err(err, errlen, "collective: joining the job failed", e);
        return nullptr;
    }
}

extern "C" void sf_coll_set_timeout(sf_coll *c, int timeout_ms)
{
    c->timeout = std::chrono::milliseconds(timeout_ms);
    c->ctx->setTimeout(c->timeout);
}

extern "C" int sf_coll_allreduce(sf_coll *c, void *buf, size_t count, sf_coll_dtype t, sf_coll_op op, char *err,
                                 size_t errlen)
{
    if (c->world == 1 || count == 0)
        return 0;
    try {
        /* A fresh tag per call: a late message of an earlier call can never
         * be taken for this one's. */
        const uint32_t tag = ++c->tag;
        switch (t) {
        case SF_COLL_F32: run_allreduce<float>(c->ctx, buf, count, op, c->timeout, tag); break;
        case SF_COLL_F64: run_allreduce<double>(c->ctx, buf, count, op, c->timeout, tag); break;
        default: run_allreduce<int64_t>(c->ctx, buf, count, op, c->timeout, tag); break;
        }
        return 0;
    } catch (const std::exception &e) {
        fill_err(err, errlen, "all-reduce failed (a peer died or did not answer)", e);
        return -1;
    }
}

extern "C" int sf_coll_broadcast(sf_coll *c, void *buf, size_t bytes, int root, char *err, size_t errlen)
{
    if (c->world == 1 || bytes == 0)
        return 0;
    try {
        gloo::BroadcastOptions o(c->ctx);
        o.setOutput(static_cast<uint8_t *>(buf), bytes);
        o.setRoot(root);
        o.setTimeout(c->timeout);
        o.setTag(++c->tag);
        gloo::broadcast(o);
        return 0;
    } catch (const std::exception &e) {
        fill_err(err, errlen, "broadcast failed (a peer died or did not answer)", e);
        return -1;
    }
}


extern "C" void sf_coll_free(sf_coll *c)
{
    try {
        delete c;
    } catch (...) {
        /* Closing pairs of a broken job may throw; nothing is left to free. */
    }
}
