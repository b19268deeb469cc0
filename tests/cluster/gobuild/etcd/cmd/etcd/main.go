// Thin main for the test control plane: upstream etcd's entry point, nothing else.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
