package main

import (
	"slices"
	"time"
)

// result is one figure set: one workload, node count and library, summed
// over every round of the run.
type result struct {
	Workload string             `json:"workload"`
	Nodes    int                `json:"nodes"`
	Lib      string             `json:"lib"`
	Metrics  map[string]float64 `json:"metrics"`
	// PerRound holds the workload's main figure for each round alone, to
	// show the spread (the metric named by Main).
	PerRound []float64 `json:"per_round,omitempty"`
	Main     string    `json:"main,omitempty"`
	Note     string    `json:"note,omitempty"`
}

// Metric names (JSON keys).
const (
	mOps          = "ops"
	mErrors       = "errors"
	mOpsPerSec    = "ops_per_s"
	mP50us        = "p50_us"
	mP99us        = "p99_us"
	mCmdsPerOp    = "client_cmds_per_op"
	mAcqPerSec    = "acquisitions_per_s"
	mAcqs         = "acquisitions"
	mHandoffP50ms = "handoff_p50_ms"
	mHandoffP99ms = "handoff_p99_ms"
	mClientCmds   = "client_cmds_per_acquisition"
	mServerCmds   = "server_cmds_per_acquisition"
	mOverlaps     = "overlaps"
	mAcqP50ms     = "acquire_p50_ms"
	mAcqP99ms     = "acquire_p99_ms"
	mRelP50ms     = "release_p50_ms"
	mRelP99ms     = "release_p99_ms"
	mAllocs       = "allocs_per_op"
	mBytes        = "bytes_per_op"
)

// percentile returns the p-quantile (0..1) of ds by the nearest-rank
// method; ds is sorted in place. Zero for no samples.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(p*float64(len(ds))+0.5) - 1
	i = max(0, min(i, len(ds)-1))
	return ds[i]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
