package deploy

import (
	"embed"
	"io/fs"
	"path"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

// chartFiles holds the Helm chart (all: keeps _helpers.tpl).
//
//go:embed all:helm/nftproxy
var chartFiles embed.FS

// chartRoot is the chart's directory in chartFiles.
const chartRoot = "helm/nftproxy"

// Chart loads the Helm chart helm/nftproxy.
func Chart() (*chart.Chart, error) {
	var files []*loader.BufferedFile
	err := fs.WalkDir(chartFiles, chartRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := chartFiles.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, &loader.BufferedFile{Name: strings.TrimPrefix(p, chartRoot+"/"), Data: data})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return loader.LoadFiles(files)
}

// RenderChart renders the chart as `helm install nftproxy -n kube-system` would,
// with vals over values.yaml checked against values.schema.json, and returns each
// manifest by template name (NOTES.txt and partials left out).
func RenderChart(vals map[string]any) (map[string]string, error) {
	ch, err := Chart()
	if err != nil {
		return nil, err
	}
	merged, err := chartutil.CoalesceValues(ch, vals)
	if err != nil {
		return nil, err
	}
	if err := chartutil.ValidateAgainstSchema(ch, merged); err != nil {
		return nil, err
	}
	rv, err := chartutil.ToRenderValues(ch, vals,
		chartutil.ReleaseOptions{Name: "nftproxy", Namespace: "kube-system", Revision: 1, IsInstall: true},
		chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	for name := range out {
		if path.Ext(name) != ".yaml" {
			delete(out, name)
		}
	}
	return out, nil
}
