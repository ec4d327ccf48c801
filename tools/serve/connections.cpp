#include "connections.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace ecokv::serve {

namespace {

thread_local connection_pool * t_pool = nullptr;  // the pool of this thread's connection
thread_local void *            t_conn = nullptr;  // its entry

// getpeername's address bytes, or "" for a socket with no peer (the listening one) or a closed fd.
std::string peer_of(int fd) {
    sockaddr_storage a{};
    socklen_t        n = sizeof a;
    return getpeername(fd, reinterpret_cast<sockaddr *>(&a), &n) == 0 ? std::string(reinterpret_cast<char *>(&a), n)
                                                                       : std::string();
}

int local_port(int fd) {
    sockaddr_storage a{};
    socklen_t        n = sizeof a;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&a), &n) != 0) {
        return -1;
    }
    if (a.ss_family == AF_INET) {
        return ntohs(reinterpret_cast<sockaddr_in *>(&a)->sin_port);
    }
    return a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6 *>(&a)->sin6_port) : -1;
}

// The connected sockets of this process on `port`, by fd.
std::vector<int> connected_sockets(int port) {
    std::vector<int> fds;
    DIR *            dir = opendir("/proc/self/fd");
    if (dir == nullptr) {
        return fds;
    }
    const int own = dirfd(dir);
    while (const dirent * e = readdir(dir)) {
        char *    end = nullptr;
        const int fd  = int(std::strtol(e->d_name, &end, 10));
        struct stat st{};
        if (end != e->d_name && *end == '\0' && fd != own && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) &&
            local_port(fd) == port && !peer_of(fd).empty()) {
            fds.push_back(fd);
        }
    }
    closedir(dir);
    return fds;
}

}  // namespace

connection_pool::connection_pool(int port, size_t max_open, std::chrono::milliseconds request_timeout) :
    port_(port), max_open_(max_open), timeout_(request_timeout), watchdog_([this] { watch(); }) {}

connection_pool::~connection_pool() { shutdown(); }

connection_pool::connection * connection_pool::adopt_new_socket() {
    for (const int fd : connected_sockets(port_)) {
        const std::string peer  = peer_of(fd);
        bool              known = false;
        for (const connection & c : conns_) {
            known |= !c.done && c.fd == fd && c.peer == peer;
        }
        if (!known) {
            connection & c = conns_.emplace_back();
            c.fd           = fd;
            c.peer         = peer;
            c.deadline     = std::chrono::steady_clock::now() + timeout_;
            return &c;
        }
    }
    return nullptr;
}

void connection_pool::enqueue(std::function<void()> fn) {
    std::unique_lock<std::mutex> lock(mutex_);
    reap();
    size_t open = 0;
    for (const connection & c : conns_) {
        open += !c.done;
    }
    connection * c = adopt_new_socket();
    if (c != nullptr && (stopping_ || open >= max_open_)) {
        refuse(c->fd);
        conns_.pop_back();
        ++refused_;
        lock.unlock();
        fn();  // the connection reads its end at once and closes
        return;
    }
    if (c == nullptr) {  // its socket was not found: served, without a deadline
        c        = &conns_.emplace_back();
        c->armed = false;
    }
    c->thread = std::thread([this, c, fn = std::move(fn)] {
        t_pool = this;
        t_conn = c;
        fn();
        const std::lock_guard<std::mutex> done(mutex_);
        c->done = true;
    });
}

// A 503 with OpenAI's error body, then both directions shut; what the client sent is read first, so that closing
// does not reset the connection before the answer arrives.
void connection_pool::refuse(int fd) {
    char buf[4096];
    while (recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
    }
    const std::string body = R"({"error":{"message":"too many open connections; retry later","type":"server_busy",)"
                             R"("param":null,"code":null}})";
    const std::string answer = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    (void) send(fd, answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(fd, SHUT_RDWR);
}

void connection_pool::watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
        wake_.wait_for(lock, std::chrono::milliseconds(100));
        const auto now = std::chrono::steady_clock::now();
        for (connection & c : conns_) {
            if (!c.done && c.armed && now > c.deadline && peer_of(c.fd) == c.peer) {
                ::shutdown(c.fd, SHUT_RDWR);  // its thread's read fails; cpp-httplib closes the connection
                c.armed = false;
                ++timed_out_;
            }
        }
    }
}

void connection_pool::reap() {
    for (auto it = conns_.begin(); it != conns_.end();) {
        if (it->done) {
            it->thread.join();
            it = conns_.erase(it);
        } else {
            ++it;
        }
    }
}

void connection_pool::shutdown() {
    std::list<connection> left;
    {
        const std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) {
            return;
        }
        stopping_ = true;
        for (connection & c : conns_) {  // kept-alive connections would wait for their next request
            if (!c.done && peer_of(c.fd) == c.peer) {
                ::shutdown(c.fd, SHUT_RDWR);
            }
        }
    }
    wake_.notify_all();
    watchdog_.join();
    for (;;) {  // threads finish and take the lock to say so: join them outside it
        std::thread t;
        {
            const std::lock_guard<std::mutex> lock(mutex_);
            for (connection & c : conns_) {
                if (c.thread.joinable()) {
                    t = std::move(c.thread);
                    break;
                }
            }
        }
        if (!t.joinable()) {
            break;
        }
        t.join();
    }
}

void connection_pool::request_received() {
    if (t_conn != nullptr) {
        const std::lock_guard<std::mutex> lock(t_pool->mutex_);
        static_cast<connection *>(t_conn)->armed = false;
    }
}

void connection_pool::answer_sent() {
    if (t_conn != nullptr) {
        const std::lock_guard<std::mutex> lock(t_pool->mutex_);
        auto * c    = static_cast<connection *>(t_conn);
        c->armed    = true;
        c->deadline = std::chrono::steady_clock::now() + t_pool->timeout_;
    }
}

connection_pool::totals connection_pool::totals_now() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    totals t{ 0, refused_, timed_out_ };
    for (const connection & c : conns_) {
        t.open += !c.done;
    }
    return t;
}

}  // namespace ecokv::serve
