"""probe's flags for a vision-language model's images (mlx-vlm), and the printing of its answer."""

from __future__ import annotations

import click


def vision_options(fn):
    options = [
        click.option("--image-size", metavar="WxH", help="Vision-language models without --data: each image's width x height in pixels [default: the family's own size, else a 1024x768 photo]."),
        click.option("--images-per-example", type=click.IntRange(min=0), help="Vision-language models without --data: images in each example [default: 1]."),
        click.option("--train-vision", is_flag=True, default=None, help="Vision-language models: also train the vision tower and projector, as mlx_vlm.train --train-vision."),
        click.option("--cache-size", metavar="ROWS", help="Vision-language models: processed rows mlx_vlm.train keeps (their pixel values), a whole number or none (no limit) [default: 32]."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def print_answer(answer, verbose: bool = False) -> None:
    from ..render.vision import render

    render(answer, verbose=verbose)
