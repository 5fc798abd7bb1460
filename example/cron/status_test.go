package main

import (
	"bufio"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStatusFlag: -status serves the fleet's page and prints its URL; a
// job paused through the page's form skips its ticks, and the summary
// counts them as paused, not missed.
func TestStatusFlag(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	var out strings.Builder
	done := make(chan error, 1)
	go func() {
		err := run(t.Context(), []string{"-status", "127.0.0.1:0", "-duration", "8s"}, pw)
		pw.Close()
		done <- err
	}()
	urls := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			out.WriteString(line + "\n")
			if rest, ok := strings.CutPrefix(line, "Status page of the fleet: "); ok {
				urls <- strings.Fields(rest)[0]
			}
		}
	})
	var page string
	select {
	case page = <-urls:
	case err := <-done:
		wg.Wait()
		t.Fatalf("run ended before printing the status page's URL: %v\n%s", err, out.String())
	}
	jar := &jarOf{}
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	// The registry is written when the instances start.
	var body string
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(body, `data-job="sync"`); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the page does not show the job sync:\n%s", body)
		}
		resp, err := c.Get(page)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
	}
	tok := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(body)
	if tok == nil {
		t.Fatal("the page has no controls")
	}
	req, _ := http.NewRequest(http.MethodPost, page+"pause", strings.NewReader(url.Values{"job": {"sync"}, "csrf": {tok[1]}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Errorf("POST pause = %d, want 303", resp.StatusCode)
	}
	err = <-done
	wg.Wait()
	if err != nil {
		t.Fatalf("run() = %v with sync paused, want nil; output:\n%s", err, out.String())
	}
	if !regexp.MustCompile(`sync: [1-9]\d* scheduled time\(s\) skipped while paused`).MatchString(out.String()) ||
		!strings.Contains(out.String(), "OK: every scheduled time ran exactly once") {
		t.Errorf("the summary does not count sync's paused ticks apart:\n%s", out.String())
	}
}

// jarOf is a cookie jar for one site.
type jarOf struct {
	mu      sync.Mutex
	cookies []*http.Cookie
}

func (j *jarOf) SetCookies(_ *url.URL, cs []*http.Cookie) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.cookies = append(j.cookies, cs...)
}

func (j *jarOf) Cookies(*url.URL) []*http.Cookie {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.cookies
}
