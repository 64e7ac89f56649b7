#!/usr/bin/env bash
# Boots Debian's arm64 kernel under qemu-system-aarch64 (TCG, 2 vCPUs) and runs the arm64
# build's table, gather, hash, daemon, store, ops and GPU (CPU-side) tests on it: what qemu-user
# refuses (io_uring, RWF_NOWAIT, the robust futex list) runs here against a real arm64 kernel.
# Usage: tools/test-arm64-vm.sh
#   ENGRAM_BUILD_DIR        native build directory (default build); the arm64 build is it + "-arm64"
#                           (the same as tools/test.sh's, a path inside the tree), built here
#   ENGRAM_VM_CPUS          vCPUs (default 2); ENGRAM_VM_MEMORY  guest memory in MiB (default 4096)
#   ENGRAM_VM_TIMEOUT_MULTIPLIER  stretches each test's meson timeout (default 10: TCG runs arm64
#                           code about ten times slower than the host, and slower on a busy one)
#   ENGRAM_VM_LIMIT         seconds after which the whole VM is stopped (default 10800)
#   ENGRAM_VM_TESTS         only these tests (names separated by spaces)
#   ENGRAM_VM_BUILD=0       run the arm64 build as it is (its targets already built)
#   ENGRAM_VM_KERNEL        the kernel's Debian package: linux-image-arm64 (default: 4 KiB pages)
#                           or linux-image-6.12-arm64-16k (16 KiB pages, from bookworm-security)
# Everything comes from Debian: qemu-system-arm and cpio (installed here if missing), and the
# arm64 packages linux-image-*-arm64, busybox-static, bash, libtinfo6 and coreutils (apt-get
# download, kept in BUILD-arm64/vm/debs, the kernel's in a folder named after its package). The
# guest boots an initramfs holding busybox, bash (also as /bin/sh), coreutils' timeout, the
# arm64 runtime libraries of the multiarch install (tools/setup.sh --arch arm64) and the kernel
# modules it needs; an ext4 disk holds the tree (at its own path) and /tmp (O_DIRECT and
# RWF_NOWAIT reads need a real file system), and the results come back over a 9p share. Ends with "N passed, N failed, N skipped"; exits 1 if a test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
armdir=${ENGRAM_BUILD_DIR:-build}-arm64
[[ $armdir != /* ]] || { echo "vm: ENGRAM_BUILD_DIR must be a path inside the tree" >&2; exit 2; }
vm=$armdir/vm
suites=(table gather hash daemon store ops gpu)
multiplier=${ENGRAM_VM_TIMEOUT_MULTIPLIER:-10}
kernel_package=${ENGRAM_VM_KERNEL:-linux-image-arm64}

install_host_tools() {
  local missing=()
  command -v qemu-system-aarch64 >/dev/null || missing+=(qemu-system-arm)
  command -v cpio >/dev/null || missing+=(cpio)
  command -v qemu-aarch64-static >/dev/null &&
    [[ -e /usr/lib/aarch64-linux-gnu/liburing.so.2 ]] || bash tools/setup.sh --arch arm64
  ((${#missing[@]} == 0)) && return
  echo "vm: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# The same configuration as tools/test.sh's arm64 build, and only the targets the suites need.
build_arm64() {
  if [[ ! -f "$armdir/build.ninja" ]]; then
    meson setup "$armdir" --cross-file cross/aarch64-linux-gnu.ini \
      -Dcuda=disabled -Dhip=disabled -Dbench=disabled -Dfuzz=disabled -Ddebug=false
  fi
  ninja -C "$armdir" build.ninja >/dev/null
  local targets
  mapfile -t targets < <(/usr/bin/python3 tools/test_plan.py "$armdir" "${suites[@]}" |
                         sed -n 's/^target //p')
  echo "vm: building the ${#targets[@]} arm64 targets of the ${suites[*]} suites"
  ninja -C "$armdir" "${targets[@]}"
}

# The kernel's own package, the one $kernel_package (a meta-package) depends on.
kernel_image() {
  dpkg-deb -f "$repo/$vm/debs/$kernel_package/${kernel_package}"_*.deb Depends | sed 's/[ ,].*//'
}

# Debian's arm64 kernel (the version $kernel_package depends on), busybox, bash.
download_packages() {
  mkdir -p "$vm/debs/$kernel_package"
  (
    cd "$vm/debs/$kernel_package"
    [[ -n $(ls "${kernel_package}"_*.deb 2>/dev/null) ]] ||
      apt-get download "$kernel_package:arm64"
    if [[ -z $(ls "${kernel_package}"_*.deb 2>/dev/null) ]]; then
      echo "vm: ENGRAM_VM_KERNEL=$kernel_package: apt-get could not download it as an arm64" \
        "package (try linux-image-arm64 or linux-image-6.12-arm64-16k)" >&2
      exit 2
    fi
    local kernel
    kernel=$(kernel_image)
    [[ -n $(ls "${kernel}"_*.deb 2>/dev/null) ]] || apt-get download "$kernel:arm64"
    cd ..
    local pkg
    for pkg in busybox-static bash libtinfo6 coreutils; do
      [[ -n $(ls "${pkg}"_*.deb 2>/dev/null) ]] || apt-get download "$pkg:arm64"
    done
  ) 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
  # The subshell's own refusal (no such package) has been said; say what else is missing.
  [[ -n $(ls "$vm/debs/$kernel_package/${kernel_package}"_*.deb 2>/dev/null) ]] || exit 2
  [[ -n $(ls "$vm/debs/$kernel_package/$(kernel_image)"_*.deb 2>/dev/null) ]] || {
    echo "vm: $(kernel_image), the kernel $kernel_package depends on, was not downloaded" >&2
    exit 2
  }
}

# The modules (with their dependencies, in load order) that the virtio disk, 9p and ext4 need
# where Debian builds them as modules; the rest is built into the kernel.
module_order() {
  local moddir=$1
  /usr/bin/python3 - "$moddir" virtio_pci virtio_blk 9pnet_virtio 9p crc32c_generic ext4 <<'PY'
import os, sys
moddir, wanted = sys.argv[1], sys.argv[2:]
deps = {}
with open(os.path.join(moddir, "modules.dep")) as f:
    for line in f:
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
by_name = {os.path.basename(p).split(".ko")[0].replace("-", "_"): p for p in deps}
order = []
def visit(path):
    for dep in deps[path]:
        visit(dep)
    if path not in order:
        order.append(path)
for name in wanted:
    if name in by_name:  # otherwise built in
        visit(by_name[name])
print("\n".join(order))
PY
}

# The guest's first process: mounts what the tests expect (proc, sys, cgroup2, /dev/shm, a disk
# at /tmp), loads the modules, runs the plan and powers off.
write_init() {
  cat > "$1/init" <<INIT
#!/bin/sh
export PATH=/bin:/sbin:/usr/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/shm /dev/pts /sys/fs/cgroup
mount -t tmpfs -o mode=1777,size=90% shm /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=0755 run /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
# Surplus huge pages on demand, as the package's sysctl file allows (resident tables use them).
echo 64 > /proc/sys/vm/nr_overcommit_hugepages
for m in \$(cat /modules.order); do insmod /lib/modules/$kernel_version/\$m; done
ip link set lo up
mkdir -p /mnt/disk $repo /results
mount -t ext4 /dev/vda /mnt/disk
mount --bind /mnt/disk/tree $repo
mount --bind /mnt/disk/tmp /tmp && chmod 1777 /tmp
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 results /results
memory=\$(awk '/MemTotal/ {print \$2 / 1024 " MiB"}' /proc/meminfo)
echo "vm: \$(uname -srm), \$(nproc) CPUs, \$memory"
sh /runner.sh
sync
poweroff -f
INIT
  chmod +x "$1/init"
}

# busybox, bash and the kernel modules from the packages; the libraries from the multiarch
# install (what the arm64 build linked against); root's and nobody's accounts.
make_initramfs() {
  local root=$vm/initramfs
  rm -rf "$root" && mkdir -p "$root"/{bin,sbin,usr/bin,etc,proc,sys,dev,tmp,root,lib}
  dpkg-deb -x "$vm"/debs/busybox-static_*.deb "$vm/busybox"
  cp "$vm/busybox/bin/busybox" "$root/bin/"
  local applet
  for applet in $("$vm/busybox/bin/busybox" --list 2>/dev/null ||
                  qemu-aarch64-static "$vm/busybox/bin/busybox" --list); do
    [[ -e $root/bin/$applet ]] || ln -s busybox "$root/bin/$applet"
  done
  # coreutils' timeout: the tests pass it --preserve-status and fractions of a second, which
  # busybox's lacks.
  rm -rf "$vm/coreutils" && dpkg-deb -x "$vm"/debs/coreutils_*.deb "$vm/coreutils"
  rm -f "$root/bin/timeout" && cp "$vm/coreutils/usr/bin/timeout" "$root/bin/timeout"
  dpkg-deb -x "$vm"/debs/bash_*.deb "$root"
  dpkg-deb -x "$vm"/debs/libtinfo6_*.deb "$root"
  ln -sf /bin/bash "$root/usr/bin/bash"
  # /bin/sh (popen, system) finds programs in PATH, as Debian's does: busybox's shell runs its
  # own applets first, and its timeout refuses --preserve-status with a usage error (exit 1).
  ln -sf bash "$root/bin/sh"
  mkdir -p "$root/var" "$root/run"
  ln -s ../tmp "$root/var/tmp"
  ln -sf /bin/env "$root/usr/bin/env"
  # The tests' run-* wrappers start the target's binaries through qemu-user on the host; here
  # the kernel runs them itself.
  printf '#!/bin/sh\nexec "$@"\n' > "$root/usr/bin/qemu-aarch64-static"
  chmod +x "$root/usr/bin/qemu-aarch64-static"
  mkdir -p "$root/usr/lib"
  cp -a /usr/lib/aarch64-linux-gnu "$root/usr/lib/"
  rm -rf "$root"/usr/lib/aarch64-linux-gnu/{pkgconfig,cmake} "$root"/usr/lib/aarch64-linux-gnu/*.a
  # Merged /usr, as Debian's: the packages' /lib/aarch64-linux-gnu (libtinfo) joins the rest.
  cp -a "$root"/lib/aarch64-linux-gnu/. "$root/usr/lib/aarch64-linux-gnu/"
  rm -rf "$root/lib/aarch64-linux-gnu"
  ln -s ../usr/lib/aarch64-linux-gnu "$root/lib/aarch64-linux-gnu"
  ln -s aarch64-linux-gnu/ld-linux-aarch64.so.1 "$root/lib/ld-linux-aarch64.so.1"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' \
    > "$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
  local moddir=$vm/kernel/lib/modules/$kernel_version m
  # Compressed modules (6.12's .ko.xz) go in uncompressed: busybox's insmod loads them as read.
  while read -r m; do
    mkdir -p "$root/lib/modules/$kernel_version/$(dirname "$m")"
    case $m in
      *.xz) xz -dc "$moddir/$m" > "$root/lib/modules/$kernel_version/${m%.xz}"; m=${m%.xz} ;;
      *) cp "$moddir/$m" "$root/lib/modules/$kernel_version/$m" ;;
    esac
    echo "$m"
  done < <(module_order "$moddir") > "$root/modules.order"
  /usr/bin/python3 tools/arm64_vm.py runner "$armdir" "$multiplier" "${suites[@]}" \
    > "$root/runner.sh"
  write_init "$root"
  (cd "$root" && find . | cpio -o -H newc --quiet) > "$vm/initramfs.cpio"
}

# The guest's disk: the tree (sources the tests read, and the arm64 build's programs and
# libraries without its object files) at its own path, and /tmp. A real file system, not 9p:
# the tests probe RWF_NOWAIT and O_DIRECT on their own binaries and files, which 9p refuses.
# Staged with hard links and copied into the image by mkfs.ext4 -d.
stage_disk() {
  local disk=$vm/disk entry
  rm -rf "$disk" && mkdir -p "$disk/tree" "$disk/tmp"
  for entry in "$repo"/* "$repo"/.[!.]*; do
    case ${entry##*/} in build* | .git | "${armdir%%/*}") continue ;; esac
    cp -al "$entry" "$disk/tree/"
  done
  mkdir -p "$disk/tree/$armdir"
  for entry in "$armdir"/* "$armdir"/.[!.]*; do
    [[ -e $entry && ${entry##*/} != vm ]] && cp -al "$entry" "$disk/tree/$armdir/"
  done
  find "$disk/tree/$armdir" \( -name '*.o' -o -name '*.a' -o -name '*.gch' \) -delete
  truncate -s 0 "$vm/scratch.img" && truncate -s 8G "$vm/scratch.img"
  mkfs.ext4 -q -F -d "$disk" "$vm/scratch.img"
  rm -rf "$disk"
}

unpack_kernel() {
  rm -rf "$vm/kernel" && mkdir -p "$vm/kernel"
  dpkg-deb -x "$vm/debs/$kernel_package/$(kernel_image)"_*.deb "$vm/kernel"
  kernel_version=$(ls "$vm/kernel/lib/modules")
  # The package leaves modules.dep to the installing machine's depmod.
  depmod -b "$vm/kernel" "$kernel_version"
}

# -cpu max has every Armv8/9 feature the build could use (LSE atomics included); its
# implementation-defined pointer authentication is the one TCG emulates quickly.
boot() {
  local results=$vm/results
  rm -rf "$results" && mkdir -p "$results"
  stage_disk
  echo "vm: booting $kernel_version under $(qemu-system-aarch64 --version | head -1)"
  timeout "${ENGRAM_VM_LIMIT:-10800}" qemu-system-aarch64 \
    -M virt -cpu max,pauth-impdef=on -accel tcg,thread=multi \
    -smp "${ENGRAM_VM_CPUS:-2}" -m "${ENGRAM_VM_MEMORY:-4096}" \
    -nographic -no-reboot -nic none \
    -kernel "$vm"/kernel/boot/vmlinuz-* -initrd "$vm/initramfs.cpio" \
    -append "console=ttyAMA0 rdinit=/init quiet panic=-1" \
    -drive "file=$vm/scratch.img,if=none,id=scratch,format=raw,cache=unsafe" \
    -device virtio-blk-pci,drive=scratch \
    -fsdev "local,id=results,path=$(realpath "$results"),security_model=none" \
    -device virtio-9p-pci,fsdev=results,mount_tag=results \
    < /dev/null | tee "$results/console.log" | grep --line-buffered '^vm: ' || true
}

start=$SECONDS
install_host_tools
[[ ${ENGRAM_VM_BUILD:-1} == 0 ]] || build_arm64
download_packages
unpack_kernel
make_initramfs
boot_start=$SECONDS
boot
rc=0
/usr/bin/python3 tools/arm64_vm.py report "$vm/results" "$armdir/meson-logs/testlog.json" || rc=1
echo "vm: $((SECONDS - start)) s in all, $((SECONDS - boot_start)) s in the VM"
exit $rc
