package syncer

import "os"

// NFTTunables is the GLIBC_TUNABLES value TuneNFT gives the nft processes: glibc's
// malloc grows its heap in 256 MiB steps (top_pad) backed by transparent huge pages
// (hugetlb=1), never returns memory to the kernel before exit (trim_threshold), and
// serves every allocation from the heap rather than from mmap (mmap_threshold).
const NFTTunables = "glibc.malloc.hugetlb=1:glibc.malloc.top_pad=268435456:" +
	"glibc.malloc.trim_threshold=4294967295:glibc.malloc.mmap_threshold=4294967295"

// TuneNFT sets GLIBC_TUNABLES to NFTTunables in the process environment, unless it is
// already set (then the user's tunables are left alone), and reports whether it set
// it. Call it once at startup, before anything runs nft.
//
// knftables runs nft with exec.CommandContext and no Env of its own, so every nft
// the proxier starts inherits the variable — and so does any other glibc program the
// process starts (an nft built on another libc ignores it). nft 1.0.6 spends some
// 40% of a large load in malloc and in page faults on its heap: a full sync of
// 50,000 Services (386,561 elements, grouped 1000 to a command;
// BenchmarkKernelFullSync) took 6.5 s without the tunables and 3.3 s with them
// (10.4 s and 5.9 s one element per command), at the same peak RSS of nft (0.6 GB
// grouped, 1.1 GB not). The tunables do not slow a small run: on the same machine,
// a 10-element "nft -f" into a table of 50 chains took a median of 10.5-10.9 ms
// without them and 9.5-9.8 ms with them (three series of 21 interleaved runs each,
// under unshare -n), at the same peak RSS of 14 MiB. The heap grows by 256 MiB of
// address space at a time; only the pages touched count in RSS.
func TuneNFT() bool {
	if _, ok := os.LookupEnv("GLIBC_TUNABLES"); ok {
		return false
	}
	os.Setenv("GLIBC_TUNABLES", NFTTunables)
	return true
}
