package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// panel is one bar chart of the figure: groups along x, one bar per
// library in each group; a zero value is a missing bar.
type panel struct {
	title, ylabel string
	groups        []string
	libs          []string
	vals          map[string][]float64 // by library, one per group
	log           bool                 // log10 y axis (values in ms)
}

// panels builds the figure's charts from the results.
func panels(rs []result) []panel {
	nodeGroups := func(wl string) []int {
		var ns []int
		for _, r := range rs {
			if r.Workload == wl && !slices.Contains(ns, r.Nodes) {
				ns = append(ns, r.Nodes)
			}
		}
		slices.Sort(ns)
		return ns
	}
	byNodes := func(wl, metric, title, ylabel string, log bool) (panel, bool) {
		ns := nodeGroups(wl)
		if len(ns) == 0 {
			return panel{}, false
		}
		p := panel{title: title, ylabel: ylabel, log: log, vals: map[string][]float64{}}
		for _, n := range ns {
			p.groups = append(p.groups, fmt.Sprintf("%d node%s", n, plural(n)))
		}
		for _, name := range allLibs {
			for i, n := range ns {
				if r := find(rs, wl, n, name); r != nil {
					if p.vals[name] == nil {
						p.libs = append(p.libs, name)
						p.vals[name] = make([]float64, len(ns))
					}
					p.vals[name][i] = r.Metrics[metric]
				}
			}
		}
		return p, true
	}
	var ps []panel
	add := func(p panel, ok bool) {
		if ok {
			ps = append(ps, p)
		}
	}
	add(byNodes(wSeq, mOpsPerSec, "1. Sequential acquire+release", "ops/s", false))
	add(byNodes(wPar, mOpsPerSec, "2. Parallel, 64 goroutines, distinct keys", "ops/s", false))
	add(byNodes(wContended, mAcqPerSec, "3. Contended, 32 goroutines, one key", "acquisitions/s", false))
	add(byNodes(wContended, mHandoffP50ms, "3. Contended: handoff p50 (log)", "release → next acquire", true))
	// Paused: groups are (nodes, acquire|release).
	if ns := nodeGroups(wPaused); len(ns) > 0 {
		p := panel{title: "4. One node paused: p99 (log)", ylabel: "latency", log: true, vals: map[string][]float64{}}
		for _, n := range ns {
			p.groups = append(p.groups, fmt.Sprintf("%d nodes acquire", n), fmt.Sprintf("%d nodes release", n))
		}
		for _, name := range allLibs {
			for i, n := range ns {
				if r := find(rs, wPaused, n, name); r != nil {
					if p.vals[name] == nil {
						p.libs = append(p.libs, name)
						p.vals[name] = make([]float64, 2*len(ns))
					}
					p.vals[name][2*i] = r.Metrics[mAcqP99ms]
					p.vals[name][2*i+1] = r.Metrics[mRelP99ms]
				}
			}
		}
		ps = append(ps, p)
	}
	add(byNodes(wAllocs, mAllocs, "5. Allocations per acquire+release", "allocs/op", false))
	return ps
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// writeChart draws the panels in a grid of up to three columns as a PNG.
func writeChart(path string, out output) error {
	ps := panels(out.Results)
	if len(ps) == 0 {
		return nil
	}
	cols := min(3, len(ps))
	rows := (len(ps) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, p := range ps {
		pl, err := p.plot()
		if err != nil {
			return fmt.Errorf("%s: %w", p.title, err)
		}
		grid[i/cols][i%cols] = pl
	}
	const tileW, tileH = 5.2 * vg.Inch, 3.6 * vg.Inch
	img := vgimg.New(vg.Length(cols)*tileW, vg.Length(rows)*tileH+0.3*vg.Inch)
	dc := draw.New(img)
	dc.Max.Y -= 0.3 * vg.Inch // room for the caption
	caption := fmt.Sprintf("schedlock redlock (%s) vs peers — %s, %s, GOMAXPROCS %d, redis %s, TTL %s; example/bench, docs/benchmarks.md",
		out.Meta.Library, out.Meta.Started.Format("2006-01-02"), out.Meta.CPU, out.Meta.GOMAXPROCS, out.Meta.Redis, out.Meta.TTL)
	full := draw.New(img)
	sty := plot.New().Title.TextStyle
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
	sty.Font.Size = vg.Points(11)
	full.FillText(sty, vg.Point{X: full.Max.X / 2, Y: full.Max.Y - 4}, caption)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, tiles, dc)
	for i := range grid {
		for j := range grid[i] {
			if grid[i][j] != nil {
				grid[i][j].Draw(canvases[i][j])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// plot builds the gonum plot of a panel. A log panel draws log10(v/lo)
// on a linear axis whose ticks are labelled with the decades of v.
func (p panel) plot() (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = p.title
	pl.Y.Label.Text = p.ylabel
	pl.Legend.Top = true
	pl.Legend.Left = true
	pl.Legend.TextStyle.Font.Size = vg.Points(8)
	pl.NominalX(p.groups...)
	lo := 1.0
	decades := 1
	if p.log {
		mn, mx := math.Inf(1), 0.0
		for _, vs := range p.vals {
			for _, v := range vs {
				if v > 0 {
					mn, mx = min(mn, v), max(mx, v)
				}
			}
		}
		if mx == 0 {
			mn, mx = 1, 10
		}
		lo = math.Pow(10, math.Floor(math.Log10(mn)))
		decades = max(1, int(math.Ceil(math.Log10(mx/lo)+0.15)))
		pl.Y.Min, pl.Y.Max = 0, float64(decades)+0.7 // headroom for the legend
		pl.Y.Tick.Marker = plot.TickerFunc(func(_, _ float64) []plot.Tick {
			var ts []plot.Tick
			for k := 0; k <= decades; k++ {
				ts = append(ts, plot.Tick{Value: float64(k), Label: fmtMs(lo * math.Pow(10, float64(k)))})
			}
			return ts
		})
	} else {
		mx := 0.0
		for _, vs := range p.vals {
			for _, v := range vs {
				mx = max(mx, v)
			}
		}
		pl.Y.Min, pl.Y.Max = 0, mx*1.35 // headroom for the legend
		pl.Y.Tick.Marker = plot.TickerFunc(func(mn, mx float64) []plot.Tick {
			ts := plot.DefaultTicks{}.Ticks(mn, mx)
			for i := range ts {
				if ts[i].Label != "" {
					ts[i].Label = fmtRate(ts[i].Value)
				}
			}
			return ts
		})
	}
	w := vg.Points(math.Min(16, 150/float64(max(1, len(p.libs)*len(p.groups)))*1.6))
	for i, name := range p.libs {
		vals := make(plotter.Values, len(p.groups))
		for g, v := range p.vals[name] {
			switch {
			case p.log && v > 0:
				vals[g] = math.Log10(v / lo)
			case !p.log:
				vals[g] = v
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return nil, err
		}
		bars.LineStyle.Width = 0
		bars.Color = libColor(name)
		bars.Offset = vg.Length(float64(i)-float64(len(p.libs)-1)/2) * w
		pl.Add(bars)
		pl.Legend.Add(libLabel(name), bars)
	}
	return pl, nil
}

func libColor(name string) color.Color {
	return plotutil.Color(slices.Index(allLibs, name))
}
