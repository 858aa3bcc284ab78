/* The cheapest upstream this machine can run: one thread, epoll, one prebuilt answer.

   For the --workers cell of proxy_overhead.py. On a 2-core machine the stub shares the
   cores with the proxy's workers and wrk, so every microsecond it spends a request is taken
   from the second worker: raw_stub.py (Python on uvloop) cost 26-31 us a request, most of
   it the interpreter. This answers each request with the bytes of a file (a whole HTTP
   response, written by proxy_overhead.py from upstream_stub's completion), so both stubs
   answer alike. HTTP/1.1 keep-alive, Content-Length bodies only (no client here sends a
   chunked one), pipelined requests answered in order.

   cc -O2 -o c_stub c_stub.c && ./c_stub PORT RESPONSE_FILE */

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_CONNECTIONS 65536
#define BUFFER_SIZE 65536

struct connection {
    char *data;
    size_t used;
};

static char *answer;
static size_t answer_size;

static long content_length(const char *head, size_t size) {
    static const char name[] = "\r\ncontent-length:";
    size_t n = sizeof name - 1;
    for (size_t i = 0; i + n <= size; i++) {
        if (strncasecmp(head + i, name, n) == 0) {
            return strtol(head + i + n, NULL, 10);
        }
    }
    return 0;
}

/* The number of whole requests at the front of the buffer, which are dropped from it. */
static int take_requests(struct connection *c) {
    int requests = 0;
    size_t start = 0;
    for (;;) {
        char *end = memmem(c->data + start, c->used - start, "\r\n\r\n", 4);
        if (end == NULL) break;
        size_t head = (size_t)(end - (c->data + start)) + 4;
        long body = content_length(c->data + start, head);
        if (body < 0 || start + head + (size_t)body > c->used) break;
        start += head + (size_t)body;
        requests++;
    }
    memmove(c->data, c->data + start, c->used - start);
    c->used -= start;
    return requests;
}

static int answer_requests(int fd, int requests) {
    for (int i = 0; i < requests; i++) {
        size_t sent = 0;
        while (sent < answer_size) {
            ssize_t n = send(fd, answer + sent, answer_size - sent, MSG_NOSIGNAL);
            if (n < 0 && errno == EAGAIN) continue; /* a loopback buffer drains at once */
            if (n <= 0) return -1;
            sent += (size_t)n;
        }
    }
    return 0;
}

static void close_connection(int epoll_fd, int fd, struct connection *connections) {
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    free(connections[fd].data);
    connections[fd].data = NULL;
}

static void read_from(int epoll_fd, int fd, struct connection *connections) {
    struct connection *c = &connections[fd];
    ssize_t n = recv(fd, c->data + c->used, BUFFER_SIZE - c->used, 0);
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
        close_connection(epoll_fd, fd, connections);
        return;
    }
    c->used += (size_t)n;
    int requests = take_requests(c);
    if (answer_requests(fd, requests) < 0 || c->used == BUFFER_SIZE) {
        close_connection(epoll_fd, fd, connections);
    }
}

static void accept_all(int epoll_fd, int listener, struct connection *connections) {
    for (;;) {
        int fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK);
        if (fd < 0) return;
        if (fd >= MAX_CONNECTIONS) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        connections[fd].data = malloc(BUFFER_SIZE);
        connections[fd].used = 0;
        struct epoll_event event = {.events = EPOLLIN, .data.fd = fd};
        epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
    }
}

static int read_answer(const char *path) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) return -1;
    fseek(file, 0, SEEK_END);
    answer_size = (size_t)ftell(file);
    fseek(file, 0, SEEK_SET);
    answer = malloc(answer_size);
    size_t got = fread(answer, 1, answer_size, file);
    fclose(file);
    return got == answer_size ? 0 : -1;
}

static int listen_on(int port) {
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&address, sizeof address) < 0) return -1;
    if (listen(listener, 4096) < 0) return -1;
    return listener;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT RESPONSE_FILE\n", argv[0]);
        return 2;
    }
    if (read_answer(argv[2]) < 0) {
        perror(argv[2]);
        return 1;
    }
    int listener = listen_on(atoi(argv[1]));
    if (listener < 0) {
        perror("listen");
        return 1;
    }
    struct connection *connections = calloc(MAX_CONNECTIONS, sizeof *connections);
    int epoll_fd = epoll_create1(0);
    struct epoll_event event = {.events = EPOLLIN, .data.fd = listener};
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listener, &event);
    printf("c stub on http://127.0.0.1:%s/v1\n", argv[1]);
    fflush(stdout);
    struct epoll_event ready[256];
    for (;;) {
        int n = epoll_wait(epoll_fd, ready, 256, -1);
        for (int i = 0; i < n; i++) {
            int fd = ready[i].data.fd;
            if (fd == listener) {
                accept_all(epoll_fd, listener, connections);
            } else {
                read_from(epoll_fd, fd, connections);
            }
        }
    }
}
