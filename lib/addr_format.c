/* lib/addr_format.c: a socket address as text for logs: "127.0.0.1:80", "[::1]:80", "unix:/run/x.sock", "unix:@name". */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include <perch/sock.h>

/* Appends a Unix name's bytes: printable ASCII as is, any other byte (an abstract name may hold any) as \xHH. */
static size_t put_name(char *out, const char *name, size_t n)
{
	size_t w = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)name[i];
		if (ch >= 0x20 && ch < 0x7f && ch != '\\')
			out[w++] = (char)ch;
		else
			w += (size_t)sprintf(out + w, "\\x%02x", ch);
	}
	out[w] = 0;
	return w;
}

/* "unix:PATH", "unix:@NAME" (abstract), or "unix:" (unnamed: a client that never bound). */
static size_t format_unix(const struct sockaddr_un *sun, socklen_t len, char *out)
{
	size_t n = len > offsetof(struct sockaddr_un, sun_path) ? len - offsetof(struct sockaddr_un, sun_path) : 0;
	/* A 108-byte path fills sun_path and the kernel's length counts a NUL past it. */
	if (n > sizeof(sun->sun_path))
		n = sizeof(sun->sun_path);
	memcpy(out, "unix:", 5);
	if (n == 0)
		return 5 + put_name(out + 5, "", 0);
	if (sun->sun_path[0] == 0) {
		out[5] = '@';
		return 6 + put_name(out + 6, sun->sun_path + 1, n - 1);
	}
	return 5 + put_name(out + 5, sun->sun_path, strnlen(sun->sun_path, n));
}

int perch_addr_format(const struct sockaddr *sa, socklen_t len, char *buf, size_t size)
{
	if (!sa || !buf || len < (socklen_t)sizeof(sa_family_t))
		return -EINVAL;
	char out[PERCH_ADDR_FORMAT_MAX], ip[INET6_ADDRSTRLEN];
	size_t n;
	if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *in4 = (const struct sockaddr_in *)sa;
		inet_ntop(AF_INET, &in4->sin_addr, ip, sizeof(ip));
		n = (size_t)snprintf(out, sizeof(out), "%s:%u", ip, ntohs(in4->sin_port));
	} else if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
		inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
		n = (size_t)snprintf(out, sizeof(out), "[%s]:%u", ip, ntohs(in6->sin6_port));
	} else if (sa->sa_family == AF_UNIX && len <= (socklen_t)sizeof(struct sockaddr_storage)) {
		n = format_unix((const struct sockaddr_un *)sa, len, out);
	} else {
		return sa->sa_family == AF_INET || sa->sa_family == AF_INET6 || sa->sa_family == AF_UNIX
			       ? -EINVAL
			       : -EAFNOSUPPORT;
	}
	if (n >= size)
		return -ENOSPC;
	memcpy(buf, out, n + 1);
	return (int)n;
}
