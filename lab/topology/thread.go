package topology

import "github.com/vishvananda/netns"

func nsHandle(fd int) netns.NsHandle { return netns.NsHandle(fd) }
