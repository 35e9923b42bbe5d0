"""Representative request bodies for int8 calibration (archive time) and accuracy checks.

    photo = synthetic_photo(seed=3)          # JPEG bytes, photo-like statistics
    text = SENTENCES[5]

No data set can be downloaded here, so images are generated: smooth colour fields, a few
shapes and sensor-like grain, JPEG-encoded, so they take the same decode path as requests.
Calibration uses seeds from 0 and the sentences in order; evaluations should use other seeds
and sentences (CALIBRATION_COUNT marks where calibration stops). A model given samples of its
own (`make model SAMPLES=`) uses those instead (handlers/samples.py).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw

CALIBRATION_COUNT = 16


SENTENCES = (
    "The committee postponed the expansion until the supplier contracts are renegotiated.",
    "A quick brown fox jumps over the lazy dog near the river bank.",
    "Interest rates rose again this quarter, and mortgage applications fell sharply.",
    "The recipe calls for two cups of flour, a pinch of salt and fresh butter.",
    "Our support team resolved the outage within forty minutes of the first report.",
    "The museum's new wing displays sculptures from the early twentieth century.",
    "She trained for months before running her first marathon in the rain.",
    "Please restart the router if the connection drops more than twice an hour.",
    "The novel follows three generations of a family of lighthouse keepers.",
    "Heavy snow closed the mountain pass, stranding dozens of trucks overnight.",
    "The update improves battery life and fixes a crash when opening large files.",
    "Volunteers planted four hundred trees along the new cycling path.",
    "I loved the film's soundtrack, but the ending felt rushed and unconvincing.",
    "The telescope captured a faint galaxy more than ten billion light years away.",
    "Quarterly revenue beat expectations thanks to strong sales in Asia.",
    "The patient was advised to rest, drink fluids and return if the fever persists.",
    # Evaluation only (after CALIBRATION_COUNT): not seen by the calibration.
    "The orchestra rehearsed the symphony twice before the opening night.",
    "Customers complained that the delivery arrived broken and two weeks late.",
    "A new study links regular exercise with better sleep in older adults.",
    "The city council approved funding for a second bridge across the harbour.",
    "He forgot his umbrella at the station and walked home soaked.",
    "The chess champion resigned after a surprising sacrifice on move thirty.",
    "This laptop is light, fast and has the best keyboard I have used.",
    "Engineers traced the leak to a cracked valve in the cooling system.",
    "The children built a sandcastle with towers, bridges and a moat.",
    "Shares of the airline fell after it cut its forecast for the summer.",
    "The hotel room was small but spotless, and the staff were friendly.",
    "Researchers sequenced the genome of a rare orchid found in the rainforest.",
    "Traffic was diverted after a water main burst beneath the main street.",
    "The documentary explains how coral reefs recover after bleaching events.",
    "My order was cancelled without notice, and nobody answers the phone.",
    "The final chapter reveals who wrote the anonymous letters.",
    # 16 more, so a model given no samples is judged on 32 held-out sentences (handlers/precompile.py).
    "Fog delayed every morning flight, so passengers waited in long queues at the gates.",
    "The bakery on the corner sells out of sourdough before nine.",
    "Firmware version 2.1 drains the battery overnight even when the device is idle.",
    "The jury deliberated for three days before reaching a unanimous verdict.",
    "A stray cat adopted the library and now sleeps on the returns desk.",
    "Wind turbines supplied almost half of the region's electricity last winter.",
    "The waiter forgot our order twice and the soup arrived cold.",
    "Students measured the speed of sound with two microphones and a stopwatch.",
    "The bridge reopened after engineers replaced its corroded cables.",
    "Terrible battery, flimsy case, and the charger stopped working after a week.",
    "The violinist's encore brought the whole audience to its feet.",
    "Farmers expect a smaller harvest after the driest summer in decades.",
    "Click the blue button, then enter the code we sent to your phone.",
    "Archaeologists uncovered a Roman mosaic beneath a car park in the town centre.",
    "The sequel is funnier, faster and far better written than the original.",
    "Power was restored to most homes by midnight, but some streets stayed dark.",
)


def synthetic_photo(seed: int, width: int = 320, height: int = 240) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(width, height)
    # A random smooth colour field: each channel a tilted plane plus a low-frequency wave.
    channels = []
    for _ in range(3):
        a, b, phase, freq = rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(0, 6.3), rng.uniform(1, 6)
        channels.append(0.5 + 0.25 * (a * x + b * y) + 0.2 * np.sin(freq * (x + y) * np.pi + phase))
    base = np.clip(np.stack(channels, axis=-1) * 255, 0, 255).astype("uint8")
    image = Image.fromarray(base)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 7))):  # objects with edges, as in real scenes
        x0, y0 = rng.integers(0, width - 20), rng.integers(0, height - 20)
        box = (int(x0), int(y0), int(x0 + rng.integers(10, width // 2)), int(y0 + rng.integers(10, height // 2)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, 6, (height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype("uint8")).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()
