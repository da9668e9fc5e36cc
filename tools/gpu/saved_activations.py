"""Bytes of activations autograd keeps per layer and token, for each memory setting of BiSSD.

Counts the distinct storages saved for backward (``torch.autograd.graph.saved_tensors_hooks``)
during one training forward in bf16 autocast, and isolates what one layer keeps per image from
four runs (1 and 2 layers x batch 1 and 2), so parameters, their bf16 casts and the stem cancel
out. Divided by the number of tokens it gives bytes per layer and token; times layers x batch x
tokens it projects a model's activation memory (without the optimizer, parameters and
workspace). Variants: ``recompute`` (``BiSSD(recompute_merge=True)``: the merged output
recomputed in backward, the least memory), ``keep-merge`` (the default: merged output kept),
``portable`` (the reference, ``reference_ops()``).

On a GPU it measures the real CUDA path. Without one, ``--interpret`` runs the same kernels on
CPU under Triton's interpreter (``tests/kernel_interpreter.py``; slow, so use a small ``--res``:
bytes per token do not depend on the length)::

    python tools/gpu/saved_activations.py --arch b --res 224               # on a GPU
    python tools/gpu/saved_activations.py --arch b --res 112 --interpret   # CPU
"""
import argparse
import os
import os.path as osp
import sys
import weakref

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

VARIANTS = {  # BiSSD arguments, or None: the reference
    'recompute': dict(recompute_merge=True),
    'keep-merge': dict(recompute_merge=False),
    'portable': None,
}
WIDTHS = dict(t=256, s=512, b=768)


def saved_bytes(fn) -> int:
    """Total bytes of the distinct storages autograd keeps for backward once ``fn`` (which
    returns its output) has run: a tensor saved and freed again during ``fn`` (its part of the
    graph dropped) is not counted, and neither can the storage reusing its address hide
    another one."""
    import torch
    saved = []

    def pack(t):
        saved.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    storages = {}
    for ref in saved:
        t = ref()
        if t is not None:  # still held by the graph of ``out``
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    del out
    return sum(storages.values())


def per_layer_image(arch: str, res: int, variant: str, device: str) -> int:
    """Bytes one layer keeps for one image: (2 layers - 1 layer) x (batch 2 - batch 1)."""
    import torch

    from mmdinomamba.models.backbones import DinoVim
    from mmdinomamba.ops import reference_ops
    got = {}
    for layers in (1, 2):
        torch.manual_seed(0)
        model = DinoVim(arch=dict(embed_dims=WIDTHS[arch], num_layers=layers),
                        mixer_cfg=VARIANTS[variant] or {}, drop_path_rate=0.).to(device)
        for batch in (1, 2):
            x = torch.randn(batch, 3, res, res, device=device)

            def step():
                with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                    return model(x)[0].float().sum()

            if VARIANTS[variant] is None:
                with reference_ops():
                    got[layers, batch] = saved_bytes(step)
            else:
                got[layers, batch] = saved_bytes(step)
    return got[2, 2] - got[2, 1] - got[1, 2] + got[1, 1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--arch', default='b', choices=sorted(WIDTHS))
    parser.add_argument('--res', type=int, default=224)
    parser.add_argument('--variants', nargs='+', default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument('--interpret', action='store_true',
                        help='no GPU: run the CUDA-path kernels on CPU under Triton\'s interpreter')
    parser.add_argument('--project', nargs=3, type=int, action='append', metavar=('LAYERS',
                        'BATCH', 'RES'), help='also project the activation memory of a model, '
                        'e.g. --project 24 64 224 (repeatable)')
    args = parser.parse_args(argv)
    if args.interpret and os.environ.get('TRITON_INTERPRET') != '1':
        # the interpreter is chosen when Triton is imported: start again with it set
        env = dict(os.environ, TRITON_INTERPRET='1')
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    if args.interpret:
        repo = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
        sys.path.insert(0, osp.join(repo, 'tests'))
        import kernel_interpreter
        kernel_interpreter.route()
        device = 'cpu'
    else:
        import torch
        if not torch.cuda.is_available():
            raise SystemExit('saved_activations: no CUDA device; use --interpret to run the CUDA '
                             'kernels on CPU under Triton\'s interpreter')
        device = 'cuda'
    tokens = (args.res // 16)**2 + 1
    print(f'DinoVim-{args.arch.upper()} layer, {args.res} px ({tokens} tokens), bf16 autocast, '
          f'{"Triton interpreter on CPU" if args.interpret else "CUDA"}')
    print(f'{"variant":<10}{"bytes/layer/token":>19}{"x recompute":>13}')
    rows = {}
    for variant in args.variants:
        rows[variant] = per_layer_image(args.arch, args.res, variant, device) / tokens
        base = rows.get('recompute')
        ratio = f'{rows[variant] / base:>13.2f}' if base else ''
        print(f'{variant:<10}{rows[variant]:>19,.0f}{ratio}', flush=True)
    for layers, batch, res in args.project or []:
        n = (res // 16)**2 + 1
        proj = ', '.join(f'{v} {b * layers * batch * n / 2**30:.2f} GiB' for v, b in rows.items())
        print(f'projected activations, {layers} layers x batch {batch} x {n} tokens: {proj}')


if __name__ == '__main__':
    main()
