/* LD_PRELOAD shim for the functional tests of the nova-gpu agent.
 *
 * libudev (used by libvirtd's node-device driver) refuses devices whose
 * directory is not on a sysfs file system. The tests bind-mount a fake
 * sysfs tree (a plain directory) over /sys in a private mount namespace,
 * so report the sysfs magic for anything below /sys.
 *
 * Every fake host's udev events go to a netlink group of its own: the
 * groups are machine-wide (one network namespace), and each libvirtd would
 * otherwise take every other fake host's mdev events for its own, each
 * costing its udev thread a second (it waits for the mdev's sysfs files).
 * With NOVA_GPU_TEST_UDEV_GROUPS set, a bind to the udev group (2) of a
 * NETLINK_KOBJECT_UEVENT socket binds to that mask instead. Nothing else
 * changes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <linux/netlink.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/vfs.h>
#include <unistd.h>

#define UDEV_GROUP 2

#define SYSFS_MAGIC 0x62656572

static int below_sys(const char *path)
{
    return path && (strcmp(path, "/sys") == 0 || strncmp(path, "/sys/", 5) == 0);
}

static int fd_below_sys(int fd)
{
    char link[64], path[4096];
    ssize_t n;

    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    n = readlink(link, path, sizeof(path) - 1);
    if (n < 0)
        return 0;
    path[n] = '\0';
    return below_sys(path);
}

int fstatfs(int fd, struct statfs *buf)
{
    static int (*real)(int, struct statfs *);
    int ret;

    if (!real)
        real = dlsym(RTLD_NEXT, "fstatfs");
    ret = real(fd, buf);
    if (ret == 0 && fd_below_sys(fd))
        buf->f_type = SYSFS_MAGIC;
    return ret;
}

int fstatfs64(int fd, struct statfs64 *buf)
{
    static int (*real)(int, struct statfs64 *);
    int ret;

    if (!real)
        real = dlsym(RTLD_NEXT, "fstatfs64");
    ret = real(fd, buf);
    if (ret == 0 && fd_below_sys(fd))
        buf->f_type = SYSFS_MAGIC;
    return ret;
}

int statfs(const char *path, struct statfs *buf)
{
    static int (*real)(const char *, struct statfs *);
    int ret;

    if (!real)
        real = dlsym(RTLD_NEXT, "statfs");
    ret = real(path, buf);
    if (ret == 0 && below_sys(path))
        buf->f_type = SYSFS_MAGIC;
    return ret;
}

int statfs64(const char *path, struct statfs64 *buf)
{
    static int (*real)(const char *, struct statfs64 *);
    int ret;

    if (!real)
        real = dlsym(RTLD_NEXT, "statfs64");
    ret = real(path, buf);
    if (ret == 0 && below_sys(path))
        buf->f_type = SYSFS_MAGIC;
    return ret;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
    static int (*real)(int, const struct sockaddr *, socklen_t);
    const char *groups = getenv("NOVA_GPU_TEST_UDEV_GROUPS");
    int proto = 0;
    socklen_t plen = sizeof(proto);

    if (!real)
        real = dlsym(RTLD_NEXT, "bind");
    if (groups && addr && addr->sa_family == AF_NETLINK &&
        len >= sizeof(struct sockaddr_nl) &&
        ((const struct sockaddr_nl *)addr)->nl_groups == UDEV_GROUP &&
        getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &plen) == 0 &&
        proto == NETLINK_KOBJECT_UEVENT) {
        struct sockaddr_nl own = *(const struct sockaddr_nl *)addr;

        own.nl_groups = (unsigned int)strtoul(groups, NULL, 0);
        return real(fd, (const struct sockaddr *)&own, sizeof(own));
    }
    return real(fd, addr, len);
}
