/* lib/unix_addr.c: a Unix domain socket's name (a path, or "@name" in the abstract namespace) as a sockaddr_un. */
#include "config.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/un.h>

#include "loop_internal.h"

/*
 * unix(7): a path is NUL-terminated inside sun_path (so at most 107
 * bytes); an abstract name starts with a NUL byte and is exactly the
 * bytes the length covers (at most 107 after it), with no terminator.
 */
int perch__unix_addr_parse(const char *name, struct sockaddr_storage *ss, socklen_t *len,
			   bool *abstract)
{
	if (!name || !*name || (name[0] == '@' && !name[1]))
		return -EINVAL;
	struct sockaddr_un *sun = (struct sockaddr_un *)ss;
	size_t n = strlen(name);
	*abstract = name[0] == '@';
	/* sun_path holds a path and its NUL, or a NUL and the name after the '@'. */
	if ((*abstract ? n - 1 : n) > sizeof(sun->sun_path) - 1)
		return -ENAMETOOLONG;
	memset(ss, 0, sizeof(*ss));
	sun->sun_family = AF_UNIX;
	if (*abstract) {
		memcpy(sun->sun_path + 1, name + 1, n - 1); /* sun_path[0] stays NUL */
		*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
	} else {
		memcpy(sun->sun_path, name, n + 1);
		*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
	}
	return 0;
}
