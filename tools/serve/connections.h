// ecokv serve: the server's connections, so that slow or idle clients cannot starve the others.
//
// cpp-httplib gives each connection a thread for its whole life, reading with a timeout per recv() only: a client
// sending a header byte every second holds its thread forever, and with a fixed pool a few hundred such clients
// block /health and every real request. This task queue runs each connection on a thread of its own, caps the
// connections open at once (past the cap, a 503 is written and the connection closed), and shuts down a connection
// that has not delivered its request (headers and body) within request_timeout of opening, or of its previous
// answer on a kept-alive connection. Linux: the connection's socket is found in /proc/self/fd when it is queued.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <thread>

namespace ecokv::serve {

class connection_pool : public httplib::TaskQueue {
  public:
    connection_pool(int port, size_t max_open, std::chrono::milliseconds request_timeout);
    ~connection_pool() override;

    void enqueue(std::function<void()> fn) override;
    void shutdown() override;

    // On a connection's thread: its request has been read (the deadline stops) / its answer sent (it restarts).
    static void request_received();
    static void answer_sent();

    struct totals {
        size_t   open = 0;
        uint64_t refused = 0, timed_out = 0;
    };
    totals totals_now() const;

  private:
    struct connection {
        int                                   fd = -1;
        std::string                           peer;  // getpeername's bytes: tells a reused fd number apart
        std::chrono::steady_clock::time_point deadline;
        bool                                  armed = true;
        std::thread                           thread;
        bool                                  done = false;
    };

    connection * adopt_new_socket();  // the queued connection's socket; under mutex_
    void         refuse(int fd);
    void         watch();
    void         reap();  // joins finished threads; under mutex_

    const int                       port_;
    const size_t                    max_open_;
    const std::chrono::milliseconds timeout_;
    mutable std::mutex              mutex_;
    std::condition_variable         wake_;
    std::list<connection>           conns_;
    bool                            stopping_ = false;
    uint64_t                        refused_ = 0, timed_out_ = 0;
    std::thread                     watchdog_;
};

}  // namespace ecokv::serve
