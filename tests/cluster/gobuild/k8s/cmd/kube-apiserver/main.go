// Thin main for the test control plane: upstream's command, nothing else.
package main

import (
	"os"
	_ "time/tzdata" // the apiserver validates CronJob.spec.timeZone with Go's zone loader

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
