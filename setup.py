"""Install mmdinomamba (see tools/setup_env.sh for the full, pinned environment)."""
import os.path as osp

from setuptools import find_packages, setup


def read_requirements(name):
    path = osp.join(osp.dirname(__file__), 'requirements', name)
    with open(path) as f:
        lines = [line.split('#')[0].strip() for line in f]
    return [line for line in lines if line]


def get_version():
    scope = {}
    with open(osp.join(osp.dirname(__file__), 'mmdinomamba', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


setup(
    name='mmdinomamba',
    version=get_version(),
    description='DINO-pretrained Vision Mamba, linear attention and ViT backbones, '
    'Binary-AUC and rank analysis as OpenMMLab plugins',
    long_description=open('README.md').read() if osp.exists('README.md') else '',
    long_description_content_type='text/markdown',
    packages=find_packages(exclude=('tests', 'tests.*', 'configs', 'tools')),
    # the native CPU kernels' source, compiled on the user's machine at first use
    package_data={'mmdinomamba.ops.cpu': ['csrc/*.cpp', 'csrc/*.h']},
    python_requires='>=3.9',
    install_requires=read_requirements('runtime.txt'),
    extras_require={
        'mm': read_requirements('mminstall.txt'),
        'tests': read_requirements('tests.txt'),
        'cuda': read_requirements('cuda.txt'),
        'tensorboard': read_requirements('optional.txt'),
    },
    license='Apache-2.0',
    zip_safe=False,
)
