package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// series is one line of a panel: points (N, milliseconds).
type series struct {
	name   string
	color  color.RGBA
	marker int // 0 circle, 1 square, 2 triangle, 3 diamond
	dashed bool
	xs, ys []float64
}

// panel is one log-log chart.
type panel struct {
	title  string
	series []series
	// target draws a horizontal dashed line at this many ms (0: none).
	target      float64
	targetLabel string
}

var (
	colorOurs    = color.RGBA{0x1f, 0x6f, 0xd0, 0xff}
	colorLegacy  = color.RGBA{0xd0, 0x30, 0x30, 0xff}
	colorPartial = color.RGBA{0x99, 0x44, 0xbb, 0xff}
	colorNFT     = color.RGBA{0xe0, 0x8a, 0x10, 0xff}
	colorBuild   = color.RGBA{0x40, 0xa0, 0x60, 0xff}
	colorGrid    = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	colorAxis    = color.RGBA{0x33, 0x33, 0x33, 0xff}
	colorTarget  = color.RGBA{0x77, 0x77, 0x77, 0xff}
)

// writePlot draws full sync time and one-Service update time against N, ours and
// the baseline, on log-log axes.
func writePlot(path string, r *Results) error {
	full := panel{title: "Full sync time vs N (log-log)", target: 5000, targetLabel: "target 5 s (at 50k)"}
	upd := panel{title: "One-Service update time vs N (log-log)", target: 25, targetLabel: "target 25 ms"}

	ours := series{name: "nftproxy (build + sync)", color: colorOurs, marker: 0}
	oursUpd := series{name: "nftproxy p50", color: colorOurs, marker: 0}
	oursUpd90 := series{name: "nftproxy p90", color: colorOurs, marker: 3, dashed: true}
	build := series{name: "nftproxy from-scratch Build", color: colorBuild, marker: 1, dashed: true}
	for _, c := range r.Control {
		ours.add(c.N, c.Full.TotalMs)
		if c.Update.N > 0 {
			oursUpd.add(c.N, c.Update.P50)
			oursUpd90.add(c.N, c.Update.P90)
		}
		if c.PureBuildMs > 0 {
			build.add(c.N, c.PureBuildMs)
		}
	}
	legacyFull := series{name: "kube-proxy iptables-legacy", color: colorLegacy, marker: 1}
	nftFull := series{name: "kube-proxy iptables-nft", color: colorNFT, marker: 2}
	legacyUpd := series{name: "iptables-legacy full restore p50", color: colorLegacy, marker: 1}
	partialUpd := series{name: "iptables-legacy partial (>=1.27) p50", color: colorPartial, marker: 2, dashed: true}
	nftUpd := series{name: "iptables-nft full restore p50", color: colorNFT, marker: 2}
	for _, b := range r.Baseline {
		f, u, pu := &legacyFull, &legacyUpd, &partialUpd
		if b.Backend == backendNFT {
			f, u, pu = &nftFull, &nftUpd, nil
		}
		if b.Full.TotalMs > 0 {
			f.add(b.N, b.Full.TotalMs)
		}
		if b.Update.N > 0 {
			u.add(b.N, b.Update.P50)
		}
		if pu != nil && b.PartialUpdate.N > 0 {
			pu.add(b.N, b.PartialUpdate.P50)
		}
	}
	full.series = []series{ours, legacyFull, nftFull}
	upd.series = []series{oursUpd, oursUpd90, build, legacyUpd, partialUpd, nftUpd}

	const w, h = 1400, 600
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	text(img, 20, 24, colorAxis, fmt.Sprintf("nftproxy scale benchmark - %s, %d CPUs, kernel %s", r.Meta.Path, r.Meta.CPUs, r.Meta.Kernel))
	drawPanel(img, image.Rect(0, 36, w/2, h), full)
	drawPanel(img, image.Rect(w/2, 36, w, h), upd)

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (s *series) add(n int, ms float64) {
	if ms > 0 {
		s.xs = append(s.xs, float64(n))
		s.ys = append(s.ys, ms)
	}
}

// drawPanel draws p into the rectangle r of img.
func drawPanel(img *image.RGBA, r image.Rectangle, p panel) {
	plot := image.Rect(r.Min.X+80, r.Min.Y+40, r.Max.X-20, r.Max.Y-150)
	text(img, plot.Min.X, r.Min.Y+20, colorAxis, p.title)

	// Axis ranges, in decades.
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range p.series {
		for i := range s.xs {
			xmin, xmax = math.Min(xmin, s.xs[i]), math.Max(xmax, s.xs[i])
			ymin, ymax = math.Min(ymin, s.ys[i]), math.Max(ymax, s.ys[i])
		}
	}
	if math.IsInf(xmin, 1) {
		text(img, plot.Min.X+20, plot.Min.Y+40, colorAxis, "nothing measured")
		return
	}
	if p.target > 0 {
		ymin, ymax = math.Min(ymin, p.target), math.Max(ymax, p.target)
	}
	lx0, lx1 := math.Log10(xmin)-0.15, math.Log10(xmax)+0.15
	ly0, ly1 := math.Floor(math.Log10(ymin)), math.Ceil(math.Log10(ymax))
	if ly1 == ly0 {
		ly1++
	}
	px := func(x float64) int {
		return plot.Min.X + int((math.Log10(x)-lx0)/(lx1-lx0)*float64(plot.Dx()))
	}
	py := func(y float64) int {
		return plot.Max.Y - int((math.Log10(y)-ly0)/(ly1-ly0)*float64(plot.Dy()))
	}

	// Grid and tick labels.
	for d := ly0; d <= ly1; d++ {
		for m := 1.0; m < 10; m++ {
			y := math.Pow(10, d) * m
			if math.Log10(y) > ly1+1e-9 {
				break
			}
			c := colorGrid
			if m != 1 {
				c = color.RGBA{0xf0, 0xf0, 0xf0, 0xff}
			}
			hline(img, plot.Min.X, plot.Max.X, py(y), c, false)
			if m == 1 {
				label := fmtTick(y)
				text(img, plot.Min.X-8-7*len(label), py(y)+4, colorAxis, label)
			}
		}
	}
	for d := math.Floor(lx0); d <= math.Ceil(lx1); d++ {
		for _, m := range []float64{1, 2, 5} {
			x := math.Pow(10, d) * m
			if math.Log10(x) < lx0 || math.Log10(x) > lx1 {
				continue
			}
			c := colorGrid
			if m != 1 {
				c = color.RGBA{0xf0, 0xf0, 0xf0, 0xff}
			}
			vline(img, px(x), plot.Min.Y, plot.Max.Y, c)
			label := short(int(x))
			text(img, px(x)-7*len(label)/2, plot.Max.Y+16, colorAxis, label)
		}
	}
	text(img, plot.Min.X+plot.Dx()/2-70, plot.Max.Y+34, colorAxis, "N (Services x 5 endpoints)")
	// Axes.
	hline(img, plot.Min.X, plot.Max.X, plot.Max.Y, colorAxis, false)
	vline(img, plot.Min.X, plot.Min.Y, plot.Max.Y, colorAxis)

	if p.target > 0 {
		y := py(p.target)
		hline(img, plot.Min.X, plot.Max.X, y, colorTarget, true)
		text(img, plot.Min.X+6, y-5, colorTarget, p.targetLabel)
	}
	for _, s := range p.series {
		for i := range s.xs {
			if i > 0 {
				thickLine(img, px(s.xs[i-1]), py(s.ys[i-1]), px(s.xs[i]), py(s.ys[i]), s.color, s.dashed)
			}
		}
		for i := range s.xs {
			marker(img, px(s.xs[i]), py(s.ys[i]), s.marker, s.color)
			if !s.dashed || s.marker == 2 {
				label := fmtTick(s.ys[i])
				text(img, px(s.xs[i])+8, py(s.ys[i])-6, s.color, label)
			}
		}
	}

	// Legend, below the axis.
	lx, ly := plot.Min.X, plot.Max.Y+56
	for i, s := range p.series {
		if len(s.xs) == 0 {
			continue
		}
		x := lx + (i%2)*300
		y := ly + (i/2)*20
		thickLine(img, x, y-4, x+28, y-4, s.color, s.dashed)
		marker(img, x+14, y-4, s.marker, s.color)
		text(img, x+36, y, colorAxis, s.name)
	}
}

// fmtTick writes a duration in ms as "100 us", "10 ms", "1 s".
func fmtTick(ms float64) string {
	switch {
	case ms >= 1000:
		return trimFloat(ms/1000) + " s"
	case ms >= 1:
		return trimFloat(ms) + " ms"
	default:
		return trimFloat(ms*1000) + " us"
	}
}

func trimFloat(v float64) string {
	if v >= 10 || v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func text(img *image.RGBA, x, y int, c color.Color, s string) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func hline(img *image.RGBA, x0, x1, y int, c color.RGBA, dashed bool) {
	for x := x0; x <= x1; x++ {
		if dashed && (x/6)%2 == 1 {
			continue
		}
		img.SetRGBA(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) {
	for y := y0; y <= y1; y++ {
		img.SetRGBA(x, y, c)
	}
}

// thickLine draws a 2-pixel line from (x0, y0) to (x1, y1).
func thickLine(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, dashed bool) {
	dx, dy := float64(x1-x0), float64(y1-y0)
	steps := int(math.Max(math.Abs(dx), math.Abs(dy)))
	if steps == 0 {
		steps = 1
	}
	for i := 0; i <= steps; i++ {
		if dashed && (i/7)%2 == 1 {
			continue
		}
		x := x0 + int(math.Round(dx*float64(i)/float64(steps)))
		y := y0 + int(math.Round(dy*float64(i)/float64(steps)))
		img.SetRGBA(x, y, c)
		img.SetRGBA(x+1, y, c)
		img.SetRGBA(x, y+1, c)
	}
}

// marker draws a filled marker of the given shape centred on (x, y).
func marker(img *image.RGBA, x, y, shape int, c color.RGBA) {
	const r = 5
	for dy := -r; dy <= r; dy++ {
		for dx := -r; dx <= r; dx++ {
			var in bool
			switch shape {
			case 0:
				in = dx*dx+dy*dy <= r*r
			case 1:
				in = abs(dx) <= r-1 && abs(dy) <= r-1
			case 2:
				in = dy >= -r && dy <= r-1 && abs(dx)*2 <= dy+r
			default:
				in = abs(dx)+abs(dy) <= r
			}
			if in {
				img.SetRGBA(x+dx, y+dy, c)
			}
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
