package lab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Leaks lists what the lab left behind after Close: namespace names still mounted, and
// threads, namespace descriptors and sockets of this process still in a lab namespace (any
// of which keeps the namespace, and the veths inside it, alive). Veths live only inside lab
// namespaces, so they go with them.
func (l *Lab) Leaks() ([]string, error) {
	leaks, err := mounted(NamePrefix + l.ID + "-")
	if err != nil {
		return nil, err
	}
	ids := map[[2]uint64]string{}
	for _, ns := range l.all {
		ids[ns.id] = ns.name
	}
	refs := func(path string, st unix.Stat_t) {
		if name, ok := ids[[2]uint64{uint64(st.Dev), uint64(st.Ino)}]; ok {
			leaks = append(leaks, fmt.Sprintf("%s refers to netns %s", path, name))
		}
	}
	tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
	for _, path := range tasks {
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil { // else the thread is gone
			refs(path, st)
		}
	}
	fds, _ := filepath.Glob("/proc/self/fd/*")
	for _, path := range fds {
		target, err := os.Readlink(path)
		if err != nil {
			continue // closed meanwhile
		}
		var st unix.Stat_t
		if !strings.HasPrefix(target, "socket:") {
			// Stat follows the link to the namespace's inode however it was opened.
			if unix.Stat(path, &st) == nil {
				refs(path, st)
			}
			continue
		}
		fd, err := strconv.Atoi(filepath.Base(path))
		if err != nil {
			continue
		}
		nsfd, err := unix.IoctlRetInt(fd, unix.SIOCGSKNS) // the socket's namespace
		if err != nil {
			continue // not a socket any more
		}
		if unix.Fstat(nsfd, &st) == nil {
			refs(path+" ("+target+")", st)
		}
		unix.Close(nsfd)
	}
	return leaks, nil
}

// Leaks lists the lab namespaces (of any lab, any process) still mounted under /run/netns.
func Leaks() ([]string, error) { return mounted(NamePrefix) }

// LeaksOf lists the namespaces still mounted of the labs with the given IDs, so that a
// suite checks its own labs and ignores those of processes running beside it.
func LeaksOf(ids []string) ([]string, error) {
	var out []string
	for _, id := range ids {
		names, err := mounted(NamePrefix + id + "-")
		if err != nil {
			return nil, err
		}
		out = append(out, names...)
	}
	return out, nil
}

// Usable reports why labs cannot be built on this machine — not root, or nft or stdbuf
// (which the trace capture uses) missing — or nil when they can.
func Usable() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: a lab creates network namespaces, veths and nftables rulesets")
	}
	for _, bin := range []string{"nft", "stdbuf"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("needs %s (apt-get install -y nftables coreutils): %w", bin, err)
		}
	}
	return nil
}

func mounted(prefix string) ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", netnsDir, err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// RemoveStale removes lab namespaces older than age, left behind by killed test processes,
// and returns their names. Younger ones may belong to a run in progress and are kept.
func RemoveStale(age time.Duration) ([]string, error) {
	names, err := mounted(NamePrefix)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, name := range names {
		fi, err := os.Lstat(filepath.Join(netnsDir, name))
		if err != nil || time.Since(fi.ModTime()) < age {
			continue
		}
		if err := netns.DeleteNamed(name); err != nil {
			errs = append(errs, fmt.Errorf("netns %s: delete: %w", name, err))
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}
