#!/usr/bin/env bash
# Builds the lab's libvirt box: Debian 12 debootstrapped from the host's own apt mirror, with the kernel,
# systemd, openssh-server, sudo and the vagrant user (Vagrant's insecure key, which `vagrant up` swaps for a
# key of its own), and the Debian packages a node needs already in it (an optimisation only: the lab's
# provisioning installs them on any box, and under software emulation dpkg is slow).
#
# The disk is one ext4 filesystem without a partition table, booted by libvirt's direct kernel boot (the box's
# Vagrantfile points the domain at the kernel and initrd inside the box): no boot loader to install, and no
# loop device or mount needed to make it (mke2fs -d fills the filesystem from a directory).
#
# Usage: build.sh [--add] [CACHE_DIR]   (default ~/.cache/pynode/lab). Prints the .box's path; --add also adds
# it to Vagrant (its VAGRANT_HOME) as pynode/bookworm unless that is this very box already. The box is named
# after the hash of this script, so it is rebuilt when its recipe changes and not otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
add=false
if [ "${1:-}" = --add ]; then add=true; shift; fi
cache=${1:-$HOME/.cache/pynode/lab}
hash=$(sha256sum "$here/build.sh" | cut -c1-12)
box="$cache/pynode-bookworm-$hash.box"

add_box() {
  $add || return 0
  local marker=${VAGRANT_HOME:-$HOME/.vagrant.d}/pynode-box
  [ "$(cat "$marker" 2>/dev/null)" = "$box" ] && return 0
  vagrant box add --force --name pynode/bookworm "$box" >&2
  echo "$box" >"$marker"
}

if [ -f "$box" ]; then add_box; echo "$box"; exit 0; fi
[ "$(id -u)" = 0 ] || { echo "build.sh: debootstrap needs root" >&2; exit 1; }
for tool in debootstrap mke2fs qemu-img; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool is missing (make lab-setup installs it)" >&2; exit 1; }
done
key=$(ls /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub 2>/dev/null | head -1)
[ -n "$key" ] || { echo "build.sh: Vagrant's insecure public key (keys/vagrant.pub of the vagrant package) is missing" >&2; exit 1; }
# the host's mirror: the first deb822 URIs line for .../debian, else the first deb line of sources.list
mirror=$(sed -n 's|^URIs: *\(\S*/debian\)/\?$|\1|p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
[ -n "$mirror" ] || { echo "build.sh: no Debian mirror in /etc/apt/sources.list*" >&2; exit 1; }

work="$cache/box-build"
rm -rf "$work"
mkdir -p "$work/rootfs"
trap 'rm -rf "$work"' EXIT
packages=linux-image-amd64,initramfs-tools,systemd-sysv,udev,dbus,openssh-server,sudo,ca-certificates
packages+=,python3,python3-venv,libseccomp2,iptables,iproute2,conntrack,ethtool,socat,mount,util-linux,kmod,procps
start=$SECONDS
debootstrap --variant=minbase --include="$packages" bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; echo "build.sh: debootstrap from $mirror failed" >&2; exit 1; }
echo "debootstrap: $((SECONDS - start)) s" >&2

r="$work/rootfs"
echo lab >"$r/etc/hostname"
printf '/dev/vda / ext4 defaults,noatime 0 1\n' >"$r/etc/fstab"
# the first interface (Vagrant's management network) by DHCP, known by its MAC (VMs of one box would otherwise
# share a client id, and one lease); Vagrant writes 50-vagrant-*.network for the others
printf '[Match]\nName=eth0\n\n[Network]\nDHCP=yes\n\n[DHCPv4]\nClientIdentifier=mac\n' \
  >"$r/etc/systemd/network/90-eth0.network"
ln -sf /lib/systemd/system/systemd-networkd.service "$r/etc/systemd/system/multi-user.target.wants/"
# every VM gets host keys of its own at first boot, not the ones debootstrap made here
rm -f "$r"/etc/ssh/ssh_host_*
mkdir -p "$r/etc/systemd/system/ssh.service.d"
printf '[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n' \
  >"$r/etc/systemd/system/ssh.service.d/host-keys.conf"
printf 'UseDNS no\n' >"$r/etc/ssh/sshd_config.d/lab.conf"
chroot "$r" useradd --create-home --shell /bin/bash vagrant
echo 'vagrant:vagrant' | chroot "$r" chpasswd
printf 'vagrant ALL=(ALL) NOPASSWD: ALL\nDefaults:vagrant !requiretty\n' >"$r/etc/sudoers.d/vagrant"
chmod 0440 "$r/etc/sudoers.d/vagrant"
install -d -m 0700 -o 1000 -g 1000 "$r/home/vagrant/.ssh"
install -m 0600 -o 1000 -g 1000 "$key" "$r/home/vagrant/.ssh/authorized_keys"
chroot "$r" apt-get clean
rm -rf "$r"/var/lib/apt/lists/* "$r"/var/log/*.log "$r/etc/machine-id" && touch "$r/etc/machine-id"

mkdir -p "$work/box"
cp "$(ls "$r"/boot/vmlinuz-* | tail -1)" "$work/box/vmlinuz"
cp "$(ls "$r"/boot/initrd.img-* | tail -1)" "$work/box/initrd.img"
mke2fs -q -t ext4 -L root -d "$r" "$work/disk.raw" 8G
qemu-img convert -O qcow2 "$work/disk.raw" "$work/box/box.img"
printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": 8}\n' >"$work/box/metadata.json"
cat >"$work/box/Vagrantfile" <<'EOF'
# direct kernel boot: the kernel and initrd ship in the box beside this file
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |libvirt|
    libvirt.kernel = File.join(__dir__, "vmlinuz")
    libvirt.initrd = File.join(__dir__, "initrd.img")
    libvirt.cmd_line = "root=/dev/vda rw console=ttyS0 net.ifnames=0"
  end
end
EOF
tar -C "$work/box" -cf "$box.tmp" metadata.json Vagrantfile vmlinuz initrd.img box.img
mv "$box.tmp" "$box"
find "$cache" -maxdepth 1 -name 'pynode-bookworm-*.box' ! -name "$(basename "$box")" -delete  # older recipes
echo "box: $((SECONDS - start)) s, $(du -m "$box" | cut -f1) MiB" >&2
add_box
echo "$box"
