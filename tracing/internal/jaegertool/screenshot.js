// screenshot.js takes the Jaeger UI screenshots of docs/observability.md
// with headless Chromium, driven by playwright-core (npm), from a Jaeger
// that serves its UI (docs/observability.md, "Jaeger with its UI").
//
//   npm install --prefix /tmp/pw playwright-core@1
//   NODE_PATH=/tmp/pw/node_modules node screenshot.js URL OUT.png [SPAN [TEXT,...]]
//
// URL is a page of the UI: a trace (/trace/<trace ID>) or a search
// (/search?service=...). For a trace, the span name column is widened to
// 42% of the window so that span names read in full, and when SPAN is
// given, the first span row whose name is SPAN is opened, then the first
// element that contains each TEXT (e.g. "Tags:,References") is clicked.
// The browser is Debian's /usr/bin/chromium (apt-get install chromium).
const { chromium } = require('playwright-core');

(async () => {
  const [url, out, span, expand] = process.argv.slice(2);
  if (!url || !out) {
    console.error('usage: node screenshot.js URL OUT.png [SPAN [TEXT,...]]');
    process.exit(2);
  }
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const width = 1400;
  const page = await browser.newPage({ viewport: { width, height: 1000 } });
  await page.goto(url);
  await page.waitForLoadState('networkidle');
  await page.waitForTimeout(1000);
  const divider = page.locator('.VerticalResizer--dragger');
  if (url.includes('/trace/') && (await divider.count()) > 0) {
    const box = await divider.first().boundingBox();
    await page.mouse.move(box.x + box.width / 2, box.y + 10);
    await page.mouse.down();
    await page.mouse.move(width * 0.42, box.y + 10, { steps: 10 });
    await page.mouse.up();
  }
  if (span) {
    await page.getByText(span, { exact: true }).first().click();
    await page.waitForTimeout(500);
    for (const text of (expand || '').split(',').filter(Boolean)) {
      await page.getByText(text).first().click();
      await page.waitForTimeout(300);
    }
  }
  await page.screenshot({ path: out, fullPage: url.includes('/trace/') });
  await browser.close();
})().catch((err) => {
  console.error(err);
  process.exit(1);
});
